#!/usr/bin/env bash
# Sensitivity of the engine's tuned constants (docs/benchmarks.md,
# "Sensitivity of the engine's constants"; make bench-sensitivity writes
# test/bench/sensitivity.md, which make bench-docs includes there): the
# bench's targets are run with
# one value changed at a time, at half and double its default (or the
# nearest value that stays in range), and one Markdown row is printed per
# run. SpeedTilt and DrainTime change by bench flag; a package constant
# changes through `go build -overlay`, so the working tree is never edited.
#
#   hack/sensitivity.sh            # each scenario file's own seed
#   SEEDS=1-3 hack/sensitivity.sh  # on seeds 1-3
#
# "guarded" counts the targets without a known miss (TestIssueTargets
# asserts them on medians over seeds); "breaks" names those that fail. The last
# columns follow the known misses (Target.Miss in test/bench/targets.go),
# which the constants move.
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=${SEEDS:-0}
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
		values = ""
		for (i = 2; i < NF; i++) values = values (i > 2 ? " " : "") $i
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
run "SpeedTilt (--speed-tilt)" 0.03 0.015 "$work/bench" --speed-tilt 0.015
run "SpeedTilt (--speed-tilt)" 0.03 0.06 "$work/bench" --speed-tilt 0.06
run "DrainTime (--drain-time)" 15s 7.5s "$work/bench" --drain-time 7.5s
run "DrainTime (--drain-time)" 15s 30s "$work/bench" --drain-time 30s
w=internal/weights
constant $w/cores.go minWaitRatio 0.02 0.01
constant $w/cores.go minWaitRatio 0.02 0.04
constant $w/cores.go coresGain 0.25 0.125
constant $w/cores.go coresGain 0.25 0.5
constant $w/cores.go ceilingGain 0.1 0.05
constant $w/cores.go ceilingGain 0.1 0.2
constant $w/estimate.go recentSigmas 2.5 1.25
constant $w/estimate.go recentSigmas 2.5 5
constant $w/drain.go hotDrain 0.8 0.4
constant $w/drain.go hotDrain 0.8 0.9
constant $w/estimate.go saturatedDiscount 0.8 0.4
constant $w/estimate.go saturatedDiscount 0.8 0.9
constant $w/split.go splitFullBelow 0.4 0.2
constant $w/split.go splitFullBelow 0.4 0.5
constant $w/split.go splitNoneFrom 0.6 0.5
constant $w/split.go splitNoneFrom 0.6 0.8
constant $w/split.go coresPool 0.2 0.1
constant $w/split.go coresPool 0.2 0.4
constant $w/split.go maxSplitLoad 0.98 0.9
constant $w/split.go maxSplitLoad 0.98 0.99
constant $w/split.go queueFadeFrom 0.9 0.45
constant $w/split.go queueFadeFrom 0.9 0.95
constant $w/split.go queueFullest 0.95 0.475
constant $w/split.go queueFullest 0.95 0.97
constant $w/split.go requestsGrace 3 1
constant $w/split.go requestsGrace 3 6
constant $w/split.go offeredGain 0.25 0.125
constant $w/split.go offeredGain 0.25 0.5
constant $w/learned.go learnedShare 0.9 0.8
constant $w/learned.go learnedShare 0.9 0.95
constant $w/alarm.go alarmLatency 2 1
constant $w/alarm.go alarmLatency 2 4
constant $w/alarm.go suspectCut 0.5 0.25
constant $w/alarm.go suspectCut 0.5 1
constant $w/drain.go suspectUtil 0.85 0.425
constant $w/drain.go suspectUtil 0.85 0.95
constant $w/bands.go loadBandFrom 0.7 0.35
constant $w/bands.go loadBandFrom 0.7 0.95
constant $w/bands.go minLoadBand 0.5 0.25
constant $w/bands.go minLoadBand 0.5 1
