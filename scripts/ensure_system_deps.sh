#!/usr/bin/env bash
# Install the system libraries the optional Mooncake Transfer Engine wheel
# (mooncake-transfer-engine-non-cuda) loads: libibverbs.so.1 (Debian/Ubuntu package
# libibverbs1) and libnuma.so.1 (libnuma1). Called by `make system-deps` (and so by `make test`
# and .ci/run).
#
# Contract: prints one line per library saying what it found or did; installs with apt-get
# only when a library is missing AND we are root (or have password-less sudo) AND apt-get
# exists; NEVER fails the build (always exits 0). When it cannot install, the Transfer Engine
# test skips and says exactly which library is missing. Set TIDESERVE_SKIP_SYSTEM_DEPS=1 to
# do nothing.
set -u

say() { echo "system-deps: $*"; }

if [ "${TIDESERVE_SKIP_SYSTEM_DEPS:-0}" = "1" ]; then
  say "skipped (TIDESERVE_SKIP_SYSTEM_DEPS=1)"
  exit 0
fi

if [ "$(uname -s)" != "Linux" ]; then
  say "not Linux: nothing to do (the Transfer Engine wheel is Linux-only)"
  exit 0
fi

# soname:Debian-package pairs (TIDESERVE_SYSTEM_DEPS_LIBS overrides, to exercise this script)
LIBS="${TIDESERVE_SYSTEM_DEPS_LIBS:-libibverbs.so.1:libibverbs1 libnuma.so.1:libnuma1}"

have_lib() {
  local soname=$1 ldconfig_bin dir
  for ldconfig_bin in ldconfig /sbin/ldconfig /usr/sbin/ldconfig; do
    if command -v "$ldconfig_bin" >/dev/null 2>&1; then
      if "$ldconfig_bin" -p 2>/dev/null | grep -q "[[:space:]]$soname[[:space:]]"; then
        return 0
      fi
      break
    fi
  done
  for dir in /lib /usr/lib /lib64 /usr/lib64 /lib/*-linux-gnu /usr/lib/*-linux-gnu; do
    [ -e "$dir/$soname" ] && return 0
  done
  return 1
}

missing_pkgs=""
for entry in $LIBS; do
  soname=${entry%%:*}
  pkg=${entry#*:}
  if have_lib "$soname"; then
    say "$soname present"
  else
    say "$soname missing (package $pkg)"
    missing_pkgs="$missing_pkgs $pkg"
  fi
done

if [ -z "$missing_pkgs" ]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  say "no apt-get here: install$missing_pkgs with your package manager; the Transfer Engine test will skip"
  exit 0
fi

if [ "$(id -u)" = "0" ]; then
  as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
  as_root="sudo -n"
else
  say "not root (and no password-less sudo): run 'sudo apt-get install -y$missing_pkgs'; the Transfer Engine test will skip"
  exit 0
fi

install() {
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -q --no-install-recommends $missing_pkgs
}

say "installing:$missing_pkgs (apt-get install -y --no-install-recommends)"
if install >/tmp/tideserve-system-deps.log 2>&1; then
  say "installed:$missing_pkgs"
  exit 0
fi
say "install failed; running apt-get update and retrying"
# shellcheck disable=SC2086
if DEBIAN_FRONTEND=noninteractive $as_root apt-get update -q >>/tmp/tideserve-system-deps.log 2>&1 &&
  install >>/tmp/tideserve-system-deps.log 2>&1; then
  say "installed:$missing_pkgs"
else
  say "could not install$missing_pkgs (see /tmp/tideserve-system-deps.log); the Transfer Engine test will skip"
fi
exit 0
