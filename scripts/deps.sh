#!/usr/bin/env bash
# Installs the Debian packages dsv4 builds against, if any is missing. Idempotent; needs root (or sudo).
set -euo pipefail
pkgs=(g++ cmake make libgtest-dev libbenchmark-dev nlohmann-json3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
