#!/usr/bin/env bash
# Run HERE (not on the device) before a device call: the device image lacks GoogleTest (and may lack
# nlohmann-json), so copy them from this machine's Debian packages (libgtest-dev sources in
# /usr/src/googletest, nlohmann-json3-dev headers + CMake config) into .gpu-deps/, an ignored folder that
# the device call names in `carry`: run(command=..., carry=[".gpu-deps"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/deps.sh
rm -rf .gpu-deps
mkdir -p .gpu-deps/prefix/include .gpu-deps/prefix/share/cmake
cp -r /usr/src/googletest .gpu-deps/googletest
cp -r /usr/include/nlohmann .gpu-deps/prefix/include/
cp -r /usr/share/cmake/nlohmann_json .gpu-deps/prefix/share/cmake/ 2>/dev/null ||
  cp -r /usr/lib/cmake/nlohmann_json .gpu-deps/prefix/share/cmake/
grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
du -sh .gpu-deps
