# Sourced by .ci/run: apt-get that waits for the package manager's lock instead of failing.
#
# apt-get exits 100 at once when another process (unattended-upgrades, a second CI job, an
# engineer's install) holds one of its locks: /var/lib/dpkg/lock-frontend and lock (install),
# /var/lib/apt/lists/lock (update; DPkg::Lock::Timeout does not cover that one in apt 2.6, so the
# call is retried). Issue 34: a CI run failed that way after 2:20. Waits at most APT_LOCK_WAIT_S
# seconds in all (default 600), polling every APT_LOCK_POLL_S (default 5), then fails saying so.

apt_get() {
  local wait_s="${APT_LOCK_WAIT_S:-600}" poll_s="${APT_LOCK_POLL_S:-5}"
  local deadline=$((SECONDS + wait_s)) said="" err rc
  while :; do
    rc=0
    err="$(apt-get -o DPkg::Lock::Timeout="$((deadline > SECONDS ? deadline - SECONDS : 0))" "$@" 2>&1 >/dev/null)" \
      || rc=$?
    if [ "$rc" -eq 0 ]; then
      return 0
    fi
    if ! grep -qE "Could not get lock|Unable to lock|Unable to acquire the dpkg frontend lock" <<<"$err"; then
      echo "$err" >&2
      return "$rc"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo ".ci/run: apt-get $*: the package manager's lock was still held after ${wait_s} s (APT_LOCK_WAIT_S):" >&2
      echo "$err" >&2
      return "$rc"
    fi
    if [ -z "$said" ]; then
      echo ".ci/run: apt-get $*: another process holds the package manager's lock; waiting for it (up to ${wait_s} s)" >&2
      echo "$err" | grep -E "held by|Could not get lock" | head -2 >&2 || true
      said=1
    fi
    sleep "$poll_s"
  done
}
