#!/usr/bin/env bash
# The whole flow on a bundled legacy repo: scan it, show the rewrite, write a migrated copy.
set -uo pipefail
cd "$(dirname "$0")/.."
FIXTURE=${1:-fixtures/cifar_towers}
OUT=out/$(basename "$FIXTURE")
TFM=.venv/bin/tfmigrate

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "tfmigrate scan $FIXTURE"
$TFM scan "$FIXTURE"

step "tfmigrate rewrite $FIXTURE   (diffs to review; nothing is changed)"
$TFM rewrite "$FIXTURE"

step "tfmigrate rewrite $FIXTURE --out $OUT"
rm -rf "$OUT"
$TFM rewrite "$FIXTURE" --out "$OUT"
echo "migrated copy: $OUT (manifest: $OUT/tfmigrate.json)"
exit 0
