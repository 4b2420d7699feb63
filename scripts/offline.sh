#!/usr/bin/env bash
# Runs a command as on a GPU machine of the device tool: no network and nothing to install with.
#   scripts/offline.sh COMMAND [ARGS...]
# - in a network namespace of its own with only loopback up (`unshare -n`; where the kernel or
#   the user refuses that, it says so and runs with the network, the other checks still apply);
# - pip, pip3, apt, apt-get, conda, uv, curl and wget on PATH replaced by shims that record the
#   call and fail; PIP_NO_INDEX=1 for `python -m pip`;
# - the Python packages ($PY -m pip freeze) compared before and after.
# Exit status: the command's, or 1 if an installer was called or a package changed.
set -uo pipefail
PY=${PY:-python3}
shims=$(mktemp -d)
trap 'rm -rf "$shims"' EXIT
for tool in pip pip3 apt apt-get conda uv curl wget; do
  printf '#!/bin/sh\necho "offline.sh: %s $*" >> "%s/called"\necho "offline.sh: %s refused (no installs, no network)" >&2\nexit 1\n' \
    "$tool" "$shims" "$tool" > "$shims/$tool"
  chmod +x "$shims/$tool"
done
before=$("$PY" -m pip freeze 2>/dev/null)
export PATH="$shims:$PATH" PIP_NO_INDEX=1
if unshare -n true 2>/dev/null; then
  unshare -n sh -c 'ip link set lo up 2>/dev/null || true; exec "$@"' sh "$@"
  status=$?
else
  echo "offline.sh: cannot make a network namespace here (unshare -n refused): network left on" >&2
  "$@"
  status=$?
fi
after=$(PATH="${PATH#"$shims:"}" "$PY" -m pip freeze 2>/dev/null)
if [ -s "$shims/called" ]; then
  echo "offline.sh: the command called an installer or a downloader:" >&2
  cat "$shims/called" >&2
  status=1
fi
if [ "$before" != "$after" ]; then
  echo "offline.sh: the installed Python packages changed:" >&2
  diff <(echo "$before") <(echo "$after") >&2
  status=1
fi
exit $status
