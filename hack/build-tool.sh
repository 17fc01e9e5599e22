#!/usr/bin/env bash
# build-tool.sh NAME[-VERSION] -- COMMAND...
#
# Runs COMMAND (a `go build` or `go install` of one of the tools in bin/) and
# keeps the user informed while it runs: which tool is building, about how
# long it takes on a small machine, and an elapsed-time line every
# BUILD_TOOL_TICK seconds (default 20), so a 8-minute compile of
# kube-apiserver cannot be mistaken for a hang. Every line starts with
# "[NAME]", so builds run in parallel (make -j2 tools) stay readable.
# The exit status is COMMAND's.
set -uo pipefail

if [ $# -lt 3 ] || [ "$2" != "--" ]; then
	echo "usage: $0 NAME -- COMMAND..." >&2
	exit 2
fi
name=$1
shift 2
tool=${name%%-v[0-9]*}

# Measured from an empty Go build cache on 2 cores (make tools, one at a
# time). A warm module cache or more cores make them shorter.
case "$tool" in
kube-apiserver) estimate="about 8 min" ;;
etcd) estimate="about 1 min" ;;
pilot-discovery) estimate="about 3.5 min" ;;
prometheus) estimate="about 4 min" ;;
controller-gen) estimate="about 1 min" ;;
kustomize) estimate="about 1 min" ;;
helm) estimate="about 2.5 min" ;;
*) estimate="a few minutes" ;;
esac
tick=${BUILD_TOOL_TICK:-20}

start=$(date +%s)
echo "[$name] Building from the Go module proxy: ${estimate} on 2 cores the first time, nothing afterwards."

"$@" &
pid=$!
# Ctrl-C or a failing sibling in make -j stops the build too.
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; exit 130' INT TERM

elapsed() {
	local s=$(($(date +%s) - start))
	printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# The ticker sleeps in short steps so a fast build is not held up by it.
(
	next=$tick
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		if [ $(($(date +%s) - start)) -ge "$next" ]; then
			echo "[$name] still building, $(elapsed) elapsed (${estimate} expected)"
			next=$((next + tick))
		fi
	done
) &
ticker=$!

wait "$pid"
status=$?
kill "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
if [ "$status" -eq 0 ]; then
	echo "[$name] built in $(elapsed)"
else
	echo "[$name] build FAILED after $(elapsed) (exit status $status)" >&2
fi
exit "$status"
