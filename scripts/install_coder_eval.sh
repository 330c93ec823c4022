#!/usr/bin/env bash
# coder-eval 0.12.16, the reference the parity tests and bench/coder_eval_parity.py check evalsite
# against, in its own virtualenv (.agents/coder-eval). It needs Python >= 3.13: the first found of
# python3.13 on PATH and pyenv's 3.13. Without one, says so and exits 0 (the tests then skip,
# unless EVALSITE_REQUIRE_CODER_EVAL=1).
set -u
cd "$(dirname "$0")/.."
DEST=.agents/coder-eval
PINS="coder-eval==0.12.16 typer==0.24.1"
[ -f "$DEST/.installed" ] && [ "$(cat "$DEST/.installed")" = "$PINS" ] && exit 0
PY=""
if command -v python3.13 >/dev/null 2>&1 && python3.13 -c '' 2>/dev/null; then
  PY=$(command -v python3.13)
elif command -v pyenv >/dev/null 2>&1; then
  version=$(pyenv versions --bare 2>/dev/null | grep -m1 '^3\.13')
  [ -n "$version" ] && PY="$(pyenv root)/versions/$version/bin/python3.13"
fi
if [ -z "$PY" ] || [ ! -x "$PY" ]; then
  echo "coder-eval: no Python 3.13 here (apt or pyenv): the checks against coder-eval 0.12.16 are skipped"
  exit 0
fi
rm -rf "$DEST"
"$PY" -m venv "$DEST" && "$DEST/bin/pip" install --disable-pip-version-check -q $PINS 2> >(grep -v "^WARNING: Location" >&2) \
  || { echo "coder-eval: the install failed" >&2; rm -rf "$DEST"; exit 1; }
echo "$PINS" > "$DEST/.installed"
echo "coder-eval: installed 0.12.16 in $DEST"
