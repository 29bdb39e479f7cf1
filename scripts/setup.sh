#!/usr/bin/env bash
# Installs the Debian 12 packages Atelier builds and tests with. Idempotent: packages already present are
# skipped, and apt-get runs only when something is missing.
set -euo pipefail
# libopenblas-dev is Debian's pthreads OpenBLAS, kept on purpose: the CPU backend runs OpenBLAS single-threaded
# inside its own OpenMP tiles (src/backend/cpu/cpu_gemm.cc says why and what was measured), so the OpenMP
# variant (libopenblas0-openmp) would bring nothing, and switching variants would relink every build here.
PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev
  libcpp-httplib-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libpng-dev libjpeg62-turbo-dev libwebp-dev
  libssl-dev  # libcrypto: SHA-256 of model files (the A1111 model hash)
  libsentencepiece-dev libhiredis-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  valgrind
  chromium chromium-driver python3-selenium  # the web UI test (tests/ui/web_ui_test.py)
  redis-server python3-yaml                  # the Redis cluster tests, the deploy manifest check
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
