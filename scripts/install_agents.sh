#!/usr/bin/env bash
# Installs the agent CLIs (`make agents`) once `make run` has the site up, one step at a time,
# saying how far it got in var/agents-install.json: the Workers page shows it, and a trial that
# needs a CLI meanwhile says it is on its way (evalsite/agents_install.py reads the file).
set -u
mkdir -p var/log
STATUS=var/agents-install.json
LOG=var/log/agents.log
STEPS=(
  "node_modules/.installed|Claude Code, Codex and Gemini CLI (npm)"
  ".agents/aider/.installed|Aider (PyPI)"
  ".agents/opencode/.installed|opencode (npm)"
  "ripgrep|ripgrep (opencode's search)"
)
STARTED=$(date +%s)
say() {  # state, step, steps done, what failed
  printf '{"state": "%s", "step": "%s", "done": %d, "total": %d, "failed": "%s", "started": %d, "updated": %d, "log": "%s"}\n' \
    "$1" "$2" "$3" "${#STEPS[@]}" "$4" "$STARTED" "$(date +%s)" "$LOG" > "$STATUS.tmp" && mv "$STATUS.tmp" "$STATUS"
}
: > "$LOG"
done_steps=0
failed=""
for entry in "${STEPS[@]}"; do
  target=${entry%%|*}
  name=${entry#*|}
  say installing "$name" "$done_steps" "$failed"
  echo "--- $name: make $target" >> "$LOG"
  if ! make --no-print-directory "$target" >> "$LOG" 2>&1; then
    failed="$failed${failed:+, }$name"
  fi
  done_steps=$((done_steps + 1))
done
if [ -n "$failed" ]; then
  say failed "" "$done_steps" "$failed"
  echo "installing the agent CLIs failed for: $failed (see $LOG; run \`make agents\` to try again)" >&2
else
  say done "" "$done_steps" ""
fi
