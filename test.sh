#!/usr/bin/env bash
# The README's second command: the test suite (CPU only, the Triton interpreter), after ./install.sh.
#
# Some tests need more than kb's Python packages (tests/needs.py): a PostgreSQL server's binaries
# (the tests start a throw-away server), headless Chromium and bubblewrap. What is missing is installed
# where it can be (root, or sudo without a password, and apt-get: Debian's packages). Otherwise the tests
# that need it are skipped, and the session ends with one line per missing piece naming them; under CI
# (CI=true) they fail instead. Arguments go to pytest: ./test.sh tests/test_doctor.py -n 1
set -euo pipefail
cd "$(dirname "$0")"
say() { echo "test.sh: $*"; }
py=.venv/bin/python
[ -x "$py" ] || { say "no .venv here: run ./install.sh first" >&2; exit 2; }

missing=$("$py" -m tests.needs)
if [ -n "$missing" ]; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null && sudo=(sudo); }
    if command -v apt-get >/dev/null && { [ "$(id -u)" -eq 0 ] || [ ${#sudo[@]} -gt 0 ]; }; then
        say "installing $missing (apt-get)"
        # shellcheck disable=SC2086  # one word per package
        "${sudo[@]}" apt-get update -q >/dev/null \
            && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null \
            || say "apt-get could not install $missing: the tests that need them are skipped (under CI: failed)"
    else
        say "missing: $missing; not installed (that needs apt-get, and root or sudo): the tests that" \
            "need them are skipped, and named at the end"
    fi
fi
exec "$py" -m pytest "$@"
