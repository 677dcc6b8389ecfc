#!/usr/bin/env bash
# Debian packages the build needs; installed when we run as root, named otherwise.
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v c++ >/dev/null || need+=(g++)
command -v cmake >/dev/null || need+=(cmake)
command -v git >/dev/null || need+=(git)
python3 -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
# Optional: OpenCL headers, ICD loader and PoCL (OpenCL on the CPU) for the OpenCL reference
# plugin and its tests; without them that plugin is not built and its tests skip.
optional=()
[ -f /usr/include/CL/cl.h ] && ls /usr/lib/*/libOpenCL.so >/dev/null 2>&1 || optional+=(ocl-icd-opencl-dev)
ls /etc/OpenCL/vendors/pocl*.icd >/dev/null 2>&1 || optional+=(pocl-opencl-icd)
command -v clinfo >/dev/null || optional+=(clinfo)
[ ${#need[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" "${optional[@]}"
else
  if [ ${#optional[@]} -gt 0 ]; then
    echo "note: the OpenCL reference plugin needs these to build and run (its tests skip without them): ${optional[*]}" >&2
    echo "      install them with: sudo apt-get install -y ${optional[*]}" >&2
  fi
  [ ${#need[@]} -eq 0 ] && exit 0
  echo "error: missing system packages: ${need[*]}" >&2
  echo "       install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
