#!/usr/bin/env bash
# check-symbols.sh: checks the shipped library's exported symbols against the recorded list
# (packaging/symbols.txt) and the C header. `make check-symbols` runs it; `make symbols` runs it
# with --write to record the current exports.
#
#   check-symbols.sh [--write] LIBRARY SYMBOLS_FILE HEADER ABI
#
# Fails when the library exports anything not named latent_cache_*, when the header declares a
# function the library does not export (or the other way round), or when a recorded symbol is
# gone while the ABI version is still the one recorded (removing or renaming a function breaks
# every program linked against it: that needs a new ABI version). New symbols pass, with a
# reminder to record them.
set -euo pipefail

write=0
if [[ ${1:-} == --write ]]; then write=1; shift; fi
[[ $# -eq 4 ]] || { echo "usage: $0 [--write] LIBRARY SYMBOLS_FILE HEADER ABI" >&2; exit 2; }
lib=$1 list=$2 header=$3 abi=$4

# Defined dynamic symbols of the library (Mach-O prefixes C names with an underscore).
if [[ $(uname -s) == Darwin ]]; then
  exports=$(nm -gU "$lib" | awk '{print $NF}' | sed 's/^_//' | sort -u)
else
  exports=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u)
fi
# The static archive (when given as ARCHIVE): its strong global definitions must be the exports
# and nothing else, so it links beside other Rust or mlx-c libraries (weak and unique globals,
# such as the C++ runtime's inline statics, merge with their twins instead of clashing). On
# Apple platforms Rust's unwinding personality stays global too (packaging/ship.mk says why).
if [[ -n ${ARCHIVE:-} ]]; then
  strong='NF == 3 && $2 ~ /^[TDBRSC]$/ {print $3}'
  if [[ $(uname -s) == Darwin ]]; then
    archived=$(nm -gU "$ARCHIVE" 2>/dev/null | awk "$strong" | sed 's/^_//' | grep -vx rust_eh_personality | sort -u)
  else
    archived=$(nm -g --defined-only "$ARCHIVE" 2>/dev/null | awk "$strong" | sort -u)
  fi
  stray=$(grep -v '^latent_cache_' <<<"$archived" || true)
  if [[ -n $stray ]]; then
    echo "error: $ARCHIVE defines global symbols besides latent_cache_*:" >&2
    head -n 20 <<<"$stray" | sed 's/^/  /' >&2
    exit 1
  fi
  [[ $archived == "$exports" ]] || { echo "error: $ARCHIVE's global functions differ from $lib's exports" >&2; exit 1; }
fi

# Functions the header declares: a declaration line names latent_cache_<name>( after its type
# (the header's static inline wrappers are not exports).
declared=$(grep -v '^static inline' "$header" | grep -oE '^[A-Za-z_][A-Za-z0-9_ ]*[ *]latent_cache_[a-z0-9_]+\(' |
  grep -oE 'latent_cache_[a-z0-9_]+\($' | tr -d '(' | sort -u)

if [[ $write == 1 ]]; then
  {
    echo "# symbols.txt: the functions the shipped library exports, one a line (make symbols writes it)."
    echo "# Removing or renaming one fails 'make test' until the ABI version below changes."
    echo "# abi $abi"
    echo "$exports"
  } >"$list"
  echo "recorded $(wc -l <<<"$exports") symbols for ABI $abi in $list"
  exit 0
fi

status=0
foreign=$(grep -v '^latent_cache_' <<<"$exports" || true)
if [[ -n $foreign ]]; then
  echo "error: $lib exports symbols that are not latent_cache_*:" >&2
  sed 's/^/  /' <<<"$foreign" >&2
  status=1
fi

missing_from_lib=$(comm -23 <(echo "$declared") <(echo "$exports"))
missing_from_header=$(comm -13 <(echo "$declared") <(grep '^latent_cache_' <<<"$exports"))
if [[ -n $missing_from_lib ]]; then
  echo "error: declared in $header but not exported by $lib:" >&2
  sed 's/^/  /' <<<"$missing_from_lib" >&2
  status=1
fi
if [[ -n $missing_from_header ]]; then
  echo "error: exported by $lib but not declared in $header (run 'make header'?):" >&2
  sed 's/^/  /' <<<"$missing_from_header" >&2
  status=1
fi

recorded_abi=$(sed -n 's/^# abi //p' "$list")
recorded=$(grep -v '^#' "$list" | sed '/^$/d' | sort -u)
removed=$(comm -23 <(echo "$recorded") <(echo "$exports"))
added=$(comm -13 <(echo "$recorded") <(echo "$exports"))
if [[ -n $removed ]]; then
  if [[ $recorded_abi == "$abi" ]]; then
    echo "error: exported symbols removed or renamed without a new ABI version (still $abi):" >&2
    sed 's/^/  /' <<<"$removed" >&2
    echo "  keep them, or raise the version in Cargo.toml (the minor for 0.x) and run 'make symbols'" >&2
    status=1
  else
    echo "note: ABI $recorded_abi -> $abi removes:" $removed "(run 'make symbols' to record the new list)"
  fi
fi
if [[ -n $added ]]; then
  echo "note: new exported symbols (run 'make symbols' to record them):" $added
fi
if [[ $recorded_abi != "$abi" ]]; then
  echo "note: $list records ABI $recorded_abi, the library is ABI $abi (run 'make symbols')"
fi
if [[ $status == 0 ]]; then
  echo "symbols: $(wc -l <<<"$exports") exported, all latent_cache_* and declared in the header; ABI $abi"
fi
exit $status
