#!/usr/bin/env bash
# The whole flow on a bundled legacy repo: scan it, show the rewrite, write a migrated copy,
# then verify a migration of it by training both programs side by side.
set -uo pipefail
cd "$(dirname "$0")/.."
FIXTURE=${1:-fixtures/towers/cifar_average}
SCRIPT=${2:-train.py}
OUT=out/$(basename "$FIXTURE")
TFM=.venv/bin/tfmigrate

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# Exit status 1 means "findings / changes pending": expected here. 2 is a real error.
run() { "$@"; local rc=$?; if [ "$rc" -ge 2 ]; then echo "demo: '$*' failed ($rc)" >&2; exit "$rc"; fi; }

step "tfmigrate scan $FIXTURE"
run $TFM scan "$FIXTURE"

step "tfmigrate rewrite $FIXTURE   (diffs to review; nothing is changed)"
run $TFM rewrite "$FIXTURE"

step "tfmigrate rewrite $FIXTURE --out $OUT"
rm -rf "$OUT"
run $TFM rewrite "$FIXTURE" --out "$OUT"
echo "migrated copy: $OUT (manifest: $OUT/tfmigrate.json)"

step "tfmigrate verify $FIXTURE/$SCRIPT $OUT/$SCRIPT --replicas 2 --steps 20 --report out/verify-report"
$TFM verify "$FIXTURE/$SCRIPT" "$OUT/$SCRIPT" --replicas 2 --steps 20 --report out/verify-report
rc=$?
echo "plot: out/verify-report/loss.png"
exit $rc
