#!/usr/bin/env bash
# root.sh: sourced by tools/swift/run.sh on Linux. Makes (once) and mounts the Debian 13 root
# folder that runs Swift here: our machines run Debian 12, which has no Swift; trixie ships
# Swift 6.0.3 (`swiftlang`), and a trixie root made with debootstrap runs it (docs/packaging.md).
# The root is kept under .deps/ between runs behind a stamp written only after the whole setup
# succeeded, so an interrupted setup is redone from scratch. Written for bash 3.2 as well (no
# arrays), like run.sh.
#
# Provides: swift_root_setup, swift_root_mount, swift_root_unmount, swift_root_exec,
# swift_root_step, swift_root_stop_step.
# Expects: SWIFT_ROOT (the root folder), SWIFT_STAMP (its stamp file).

# Runs a long step in the background and waits for it, so an interrupt reaches the caller's
# traps at once: debootstrap ignores SIGINT, and bash, waiting for a foreground child that
# survives a Ctrl-C, drops the signal and goes on with the next step.
swift_root_child=
swift_root_step() {
  local rc=0
  "$@" &
  swift_root_child=$!
  wait "$swift_root_child" || rc=$?
  swift_root_child=
  return $rc
}

# Ends the running step and everything it started (for the caller's exit trap). The tree is
# frozen first (SIGSTOP, top down, until no new process shows), so nothing spawns or is
# reparented to init while it is collected; then every process of it is killed. A gentler
# SIGTERM is not enough: debootstrap's helpers outlived it and went on writing into the root.
swift_root_tree() {
  local c
  echo "$1"
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do swift_root_tree "$c"; done
}
swift_root_stop_step() {
  [ -n "$swift_root_child" ] || return 0
  local seen="" now="" pass
  for pass in 1 2 3 4 5; do
    now=$(swift_root_tree "$swift_root_child" | sort -n | tr '\n' ' ')
    [ "$now" = "$seen" ] && break
    kill -STOP $now 2>/dev/null || true
    seen=$now
  done
  kill -KILL $seen 2>/dev/null || true
  wait "$swift_root_child" 2>/dev/null || true
  swift_root_child=
}

# The Debian mirror this machine already uses (deb822 `URIs:` or one-line `deb` sources), so
# the root comes from the same place as the machine's own packages.
swift_root_mirror() {
  local m
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }')
  if [ -z "$m" ]; then
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/ && $i !~ /security/) { print $i; exit } }')
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

# Mount points of the root still mounted (a run killed with SIGKILL leaves them), deepest first.
swift_root_mounts() {
  awk -v root="$SWIFT_ROOT" 'index($2, root "/") == 1 { print $2 }' /proc/mounts | sort -r
}

swift_root_unmount() {
  local m
  for m in $(swift_root_mounts); do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "warning: could not unmount $m" >&2
  done
}

swift_root_mount() {
  swift_root_unmount
  # Without /proc every swift command dies at start ("Signal 4: Backtracing ... failed").
  mount -t proc proc "$SWIFT_ROOT/proc"
  mount --bind /dev "$SWIFT_ROOT/dev"
}

# Runs a shell command inside the root with a clean environment; Swift's own runtime libraries
# are not on the loader path by default in Debian's package.
swift_root_exec() {
  chroot "$SWIFT_ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/usr/libexec/swift/lib/swift/linux \
    DEBIAN_FRONTEND=noninteractive /bin/bash -c "$1"
}

swift_root_setup() {
  # (usr/bin/swift is an absolute link, which resolves only inside the root.)
  if [ -f "$SWIFT_STAMP" ] && [ -d "$SWIFT_ROOT/usr/libexec/swift/bin" ]; then
    return 0
  fi
  [ "$(id -u)" = 0 ] || { echo "test-swift: setting up $SWIFT_ROOT needs root (debootstrap, chroot)" >&2; return 1; }
  echo "== setting up the Swift toolchain root in $SWIFT_ROOT (once; 3 to 4 minutes and 3 GB)"
  if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  rm -f "$SWIFT_STAMP"
  # A half-made root from an interrupted setup: unmount what it had mounted, then remove it
  # without crossing into any other file system (never into a bind-mounted /dev).
  swift_root_unmount
  rm -rf --one-file-system "$SWIFT_ROOT"
  mkdir -p "$(dirname "$SWIFT_ROOT")"
  swift_root_step debootstrap --variant=minbase trixie "$SWIFT_ROOT" "$(swift_root_mirror)" >"$SWIFT_ROOT.log" 2>&1 ||
    { tail -n 20 "$SWIFT_ROOT.log" >&2; return 1; }
  cp /etc/resolv.conf "$SWIFT_ROOT/etc/resolv.conf"
  swift_root_mount
  # libc6-dev: without it swiftc finds no libc and C modules fail to import; pkgconf: the
  # system-library target's pkg-config lookup.
  swift_root_step swift_root_exec 'apt-get update -qq && apt-get install -y -qq --no-install-recommends swiftlang libc6-dev libstdc++-14-dev pkgconf >/dev/null && apt-get clean' \
    >>"$SWIFT_ROOT.log" 2>&1 || { tail -n 20 "$SWIFT_ROOT.log" >&2; return 1; }
  swift_root_exec 'swift --version' >/dev/null 2>&1 || { echo "test-swift: swift does not run in $SWIFT_ROOT" >&2; return 1; }
  # The stamp last, by rename: it exists only when every step above finished.
  echo "trixie swiftlang $(swift_root_exec "dpkg-query -W -f '\${Version}' swiftlang")" >"$SWIFT_STAMP.tmp"
  mv "$SWIFT_STAMP.tmp" "$SWIFT_STAMP"
}
