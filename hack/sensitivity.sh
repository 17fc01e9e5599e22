#!/usr/bin/env bash
# Sensitivity of the engine's tuned constants (docs/benchmarks.md,
# "Sensitivity of the engine's constants"; make bench-sensitivity writes
# test/bench/sensitivity.md, which make bench-docs includes there): the
# bench's targets are run with
# one value changed at a time, at half and double its default (or the
# nearest value that stays in range), and one Markdown row is printed per
# run. Params change by bench flag; a package constant
# changes through `go build -overlay`, so the working tree is never edited.
#
#   hack/sensitivity.sh            # medians over seeds 1-8
#   SEEDS=0 hack/sensitivity.sh    # each scenario file's own seed (8x faster)
#
# One seed is not enough to judge a row: at the defaults a single seed can
# already break a guarded target that the medians over seeds hold (the
# guard, TestIssueTargets, judges medians too), and a row would then show
# that seed's luck rather than the constant's effect.
#
# "guarded" counts the targets without a known miss (TestIssueTargets
# asserts them on medians over seeds); "breaks" names those that fail. The last
# columns follow the known misses (Target.Miss in test/bench/targets.go),
# which the constants move.
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=${SEEDS:-1-8}
scenarios=test/bench/scenarios
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

go build -o "$work/bench" ./test/bench

# summarise LABEL DEFAULT TRIED reads the targets table in $work/out and
# prints its row: the guarded targets (verdict without "known"), then the
# values of the known misses, in the table's order. With LABEL "", it
# prints the header for those columns instead.
summarise() {
	awk -F' \\| ' -v label="$1" -v def="$2" -v tried="$3" '
	/^\| / && !/^\| target / && !/^\|---/ {
		name = substr($1, 3)
		verdict = $NF; sub(/ \|$/, "", verdict)
		values = $(NF - 1) # the median over several seeds, else the one seed value
		if (verdict ~ /known/) {
			head = head " " name " |"; sep = sep "---:|"
			watched = watched " " values " |"
			next
		}
		total++
		if (verdict == "yes") held++
		else breaks = breaks (breaks ? "; " : "") name ": " values
	}
	END {
		if (!total) { print "no targets in the output" > "/dev/stderr"; exit 1 }
		if (label == "") {
			print "| constant | default | tried | guarded targets holding | breaks |" head
			print "|---|---|---|---:|---|" sep
			exit
		}
		print "| " label " | " def " | " tried " | " held+0 "/" total " | " (breaks ? breaks : "none") " |" watched
	}' "$work/out"
}

# run LABEL DEFAULT TRIED BINARY [FLAGS...]
run() {
	local label=$1 def=$2 tried=$3 bin=$4
	shift 4
	"$bin" --targets "$scenarios" --seeds "$seeds" "$@" >"$work/out"
	summarise "$label" "$def" "$tried"
}

# constant FILE NAME DEFAULT TRIED builds the bench with NAME = TRIED in
# FILE (checking that FILE has exactly one line NAME = DEFAULT) and runs it.
constant() {
	local file=$1 name=$2 def=$3 tried=$4
	local edited=$work/$(basename "$file")
	local line="^([[:space:]]*(const )?$name[[:space:]]*=[[:space:]]*)$def\$"
	if [ "$(grep -cE "$line" "$file")" != 1 ]; then
		echo "sensitivity: not exactly one line \"$name = $def\" in $file" >&2
		exit 1
	fi
	sed -E "s/$line/\1$tried/" "$file" >"$edited"
	printf '{"Replace": {"%s": "%s"}}\n' "$PWD/$file" "$edited" >"$work/overlay.json"
	go build -overlay "$work/overlay.json" -o "$work/bench-edited" ./test/bench
	run "$name" "$def" "$tried" "$work/bench-edited"
}

"$work/bench" --targets "$scenarios" --seeds "$seeds" >"$work/out"
summarise "" "" ""
summarise "(all defaults)" "" ""
run "DrainTime (--drain-time)" 15s 7.5s "$work/bench" --drain-time 7.5s
run "DrainTime (--drain-time)" 15s 30s "$work/bench" --drain-time 30s
run "DeadBand (--dead-band)" 0.05 0.025 "$work/bench" --dead-band 0.025
run "DeadBand (--dead-band)" 0.05 0.1 "$work/bench" --dead-band 0.1
run "Smoothing (--smoothing)" 0.05 0.025 "$work/bench" --smoothing 0.025
run "Smoothing (--smoothing)" 0.05 0.1 "$work/bench" --smoothing 0.1
run "MaxStep (--max-step)" 1 0.5 "$work/bench" --max-step 0.5
run "MaxStep (--max-step)" 1 2 "$work/bench" --max-step 2
run "MaxRatio (--max-ratio)" 20 10 "$work/bench" --max-ratio 10
run "MaxRatio (--max-ratio)" 20 40 "$work/bench" --max-ratio 40
w=internal/weights
constant $w/estimate.go zSigmas 4 2
constant $w/estimate.go zSigmas 4 8
constant $w/decide.go maxUtilisation 0.93 0.85
constant $w/decide.go maxUtilisation 0.93 0.96
constant $w/observe.go saturatedUse 0.97 0.9
constant $w/observe.go saturatedUse 0.97 0.99
constant $w/alarm.go alarmLatency 4 2
constant $w/alarm.go alarmLatency 4 8
constant $w/params.go smallestWeight 100 50
constant $w/params.go smallestWeight 100 200
