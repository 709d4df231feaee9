#!/usr/bin/env bash
# ninelives in any CI system: a plain shell recipe (on GitHub Actions, github-actions.yml
# beside this file does the same with a job summary, artifacts and annotations).
#
#   bash other-ci.sh smoke               on every push: the smoke campaign, real processes
#   SHARD=2/4 bash other-ci.sh soak      nightly, in each of 4 parallel jobs: one shard of
#                                        the soak's seeds, in simulation
#   bash other-ci.sh merge DIR...        after them: the shards' folders as one report
#
# Settings (environment): ENGINE (default reference; your adapter as module:object),
# SCENARIO, PROFILE, SEEDS (N or A..B), SHARD (I/N), OUT (default ci-reports),
# NINELIVES (the command, default ninelives).
#
# Exit codes, passed on from ninelives: 0 every invariant with evidence holds; 1 an
# invariant failed; 2 the harness could not run or judge (bad input, a run in error, a
# shard missing at the merge). Fail the CI job on anything but 0.
#
# What to collect: the folder the last line names. Its junit.xml is the test report (one
# test case per invariant: point the CI's JUnit reader at it), summary.md the text for a
# job summary or a merge-request comment, report.html the page for people, campaign.json
# the record for machines; a failing seed's own run folder is under it, and summary.md
# gives the command that reruns it.
set -uo pipefail

NINELIVES=${NINELIVES:-ninelives}
ENGINE=${ENGINE:-reference}
OUT=${OUT:-ci-reports}
step=${1:-}

case "$step" in
  smoke)
    folder="$OUT/smoke"
    "$NINELIVES" run "${SCENARIO:-smoke}" --profile "${PROFILE:-ci}" --engine "$ENGINE" \
      --seeds "${SEEDS:-1}" --out "$folder"
    code=$?
    ;;
  soak)
    shard=${SHARD:-1/1}
    folder="$OUT/shard-${shard%%/*}"
    "$NINELIVES" sim "${SCENARIO:-everything}" --profile "${PROFILE:-soak}" --swarm \
      --engine "$ENGINE" --seeds "${SEEDS:-1..2000}" --shard "$shard" --out "$folder" --quiet
    code=$?
    ;;
  merge)
    shift
    folder="$OUT/soak"
    "$NINELIVES" merge "$@" --out "$folder"
    code=$?
    ;;
  *)
    echo "usage: bash other-ci.sh smoke | soak | merge SHARD_FOLDER..." >&2
    exit 2
    ;;
esac

case $code in
  0) verdict="pass: every invariant with evidence holds" ;;
  1) verdict="FAIL: an invariant failed" ;;
  *) verdict="ERROR: the harness could not run or judge it" ;;
esac
if [ -f "$folder/junit.xml" ]; then
  echo "ninelives $step: exit $code, $verdict; JUnit: $folder/junit.xml, summary: $folder/summary.md"
else
  echo "ninelives $step: exit $code, $verdict; no report written (the lines above say why)"
fi
exit "$code"
