#!/usr/bin/env bash
# The browser the console's tests drive (tests/e2e/test_console_browser.py): Debian's chromium,
# driven headless by the playwright Python package (no `playwright install`: no browser download
# from a CDN). Installs it with apt-get when /usr/bin/chromium is missing and apt-get is available
# (as root, or through sudo without a password); otherwise says how to get it and exits 0: the
# browser tests then skip, saying why, and everything else still runs.
set -uo pipefail

CHROMIUM=${VMSCHED_CHROMIUM:-/usr/bin/chromium}

if [ -x "$CHROMIUM" ]; then
  exit 0
fi
for other in chromium chromium-browser google-chrome; do
  if command -v "$other" >/dev/null 2>&1; then
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser.sh: no chromium, and no apt-get to install it: the console's browser tests will skip." >&2
  echo "            Install chromium (or set VMSCHED_CHROMIUM to a Chrome/Chromium binary) to run them." >&2
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "browser.sh: chromium is missing; run 'sudo apt-get install chromium' to run the console's browser tests." >&2
  exit 0
fi

echo "browser.sh: installing chromium with apt-get (for the console's browser tests)" >&2
if ! { "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq chromium; }; then
  echo "browser.sh: apt-get could not install chromium: the console's browser tests will skip." >&2
fi
exit 0
