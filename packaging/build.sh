#!/usr/bin/env bash
# Builds the six packages from a clean checkout: mopd, mop-server and mop-curate (the
# curator CLI alone), each as .deb (cargo-deb) and .rpm (cargo-generate-rpm), into
# packaging/out/ (or $1).
#
#   bash packaging/build.sh [OUT_DIR]
#
# Installs the two cargo packagers when they are missing. Binaries come from the `dist`
# profile (release, stripped), built once for both formats.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-packaging/out}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

need() {
  command -v "cargo-$1" >/dev/null || {
    echo "== installing cargo-$1 (one time) =="
    cargo install --locked "cargo-$1"
  }
}
need deb
need generate-rpm

echo "== building mopd, mop, mop-server and mop-curate (profile dist) =="
cargo build --locked --profile dist -p mopd -p mop -p mop-server -p mop-curate

for pkg in mopd mop-server mop-curate; do
  echo "== $pkg .deb =="
  cargo deb --locked -p "$pkg" --profile dist --no-build -o "$out/"
  echo "== $pkg .rpm =="
  cargo generate-rpm -p "crates/$pkg" --profile dist -o "$out/"
done

echo "== packages in $out =="
ls -l "$out"/*.deb "$out"/*.rpm
