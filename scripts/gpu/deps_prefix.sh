# Sourced by the device scripts (on the device): builds GoogleTest from the carried sources when the image
# lacks it and sets PREFIX for -DCMAKE_PREFIX_PATH. Needs JOBS and a log path in DEPS_LOG.
# DEPS: the carried folder (default .gpu-deps, made by scripts/gpu/stage_deps.sh).
DEPS=${DEPS:-.gpu-deps}
PREFIX=""
if [ -d "$DEPS/googletest" ] && ! [ -e /usr/lib/x86_64-linux-gnu/cmake/GTest ]; then
  { cmake -S "$DEPS/googletest" -B /tmp/gtest-build -DCMAKE_INSTALL_PREFIX=/tmp/deps -DBUILD_GMOCK=OFF \
      -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/gtest-build -j "$JOBS" && cmake --install /tmp/gtest-build; } \
    > "$DEPS_LOG" 2>&1 || { echo "googletest build failed"; tail "$DEPS_LOG"; exit 1; }
  PREFIX="/tmp/deps"
fi
[ -d "$DEPS/prefix" ] && PREFIX="${PREFIX:+$PREFIX;}$PWD/$DEPS/prefix"
