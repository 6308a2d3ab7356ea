#!/usr/bin/env bash
# mlx-c-src.sh: prints the mlx-c source tree the library's bindings come from, so the host test
# compiles the very same mlx-c: $MLX_C_SRC when set (crates/mlx-sys/build.rs honours it too),
# otherwise the tree inside crates.io's mlx-sys package of the version build.rs pins, located as
# build.rs does (cargo metadata of a throwaway manifest; cargo fetches the package if needed).
# With VERSION, the tree of crates.io's mlx-sys of that version instead (an engine's other mlx-c:
# mlx-sys 0.6.0 carries mlx-c 0.6.0).
#
#   mlx-c-src.sh REPO_ROOT WORK_DIR [VERSION]
set -euo pipefail
[[ $# -eq 2 || $# -eq 3 ]] || { echo "usage: $0 REPO_ROOT WORK_DIR [VERSION]" >&2; exit 2; }
root=$1 work=$2 version=${3:-}

if [[ -z $version && -n ${MLX_C_SRC:-} ]]; then
  echo "$MLX_C_SRC"
  exit 0
fi
if [[ -z $version ]]; then
  version=$(sed -n 's/^const UPSTREAM_VERSION: &str = "\(.*\)";/\1/p' "$root/crates/mlx-sys/build.rs")
fi
[[ -n $version ]] || { echo "$0: no UPSTREAM_VERSION in crates/mlx-sys/build.rs" >&2; exit 1; }
mkdir -p "$work/src"
: >"$work/src/lib.rs"
cat >"$work/Cargo.toml" <<TOML
[package]
name = "mlx-c-source"
version = "0.0.0"
edition = "2021"
[dependencies]
mlx-sys = { version = "=$version", default-features = false }
[workspace]
TOML
# The manifest path of mlx-sys-<version>; its src/mlx-c is the tree.
manifest=$(cargo metadata --format-version 1 --manifest-path "$work/Cargo.toml" |
  python3 -c 'import json, sys
want = "mlx-sys-" + sys.argv[1] + "/Cargo.toml"
paths = [p["manifest_path"] for p in json.load(sys.stdin)["packages"]]
print(next(p for p in paths if p.replace("\\", "/").endswith(want)))' "$version")
tree=$(dirname "$manifest")/src/mlx-c
[[ -f $tree/mlx/c/mlx.h ]] || { echo "$0: no mlx-c under $tree" >&2; exit 1; }
echo "$tree"
