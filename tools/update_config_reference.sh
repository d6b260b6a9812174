#!/usr/bin/env bash
# Writes the key table of docs/configuration.md (its first ``` block) from the option
# table, as `transformer_hpc --help` prints it: run after adding or changing a key.
# test_config (Config.ConfigurationReferenceIsTheHelpText) fails until the two agree.
#   bash tools/update_config_reference.sh [BUILD_DIR]     # default: build
set -euo pipefail
# BUILD_DIR from where the script was called, or from the repository's root (build).
build=${1:-build}
[ -n "${1:-}" ] && [ -d "$1" ] && build=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
[ -x "$build/transformer_hpc" ] || {
  echo "update_config_reference: no $build/transformer_hpc: give the build directory" \
       "(default build, under the repository's root)" >&2
  exit 2
}
doc=docs/configuration.md
help=$(mktemp)
updated=$(mktemp "$doc.XXXXXX")
trap 'rm -f "$help" "$updated"' EXIT
"$build/transformer_hpc" --help > "$help"
# Everything outside the first fenced block is kept; the block's lines are replaced.
awk -v help_file="$help" '
  /^```/ && fence < 2 {
    print
    if (++fence == 1) { while ((getline line < help_file) > 0) print line }
    next
  }
  fence != 1 { print }
' "$doc" > "$updated"
[ "$(grep -c '^```' "$updated")" = "$(grep -c '^```' "$doc")" ] ||
  { echo "update_config_reference: $doc lost a fence; left unchanged" >&2; exit 1; }
cat "$updated" > "$doc"   # keeps the file's mode
echo "update_config_reference: $doc holds $build/transformer_hpc --help"
