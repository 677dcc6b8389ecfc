#!/usr/bin/env bash
# Debian packages the build needs; installed when we run as root, named otherwise.
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v c++ >/dev/null || need+=(g++)
command -v cmake >/dev/null || need+=(cmake)
command -v git >/dev/null || need+=(git)
python3 -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
else
  echo "error: missing system packages: ${need[*]}" >&2
  echo "       install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
