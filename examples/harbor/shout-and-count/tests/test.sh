#!/bin/bash
# One reward per check in reward.json: evalsite grades each key as a criterion of its own.
mkdir -p /logs/verifier
cd /app || exit 1
count=0
upper=0
[ "$(tr -d ' \n' < count.txt 2>/dev/null)" = "$(wc -l < input.txt | tr -d ' ')" ] && count=1
[ -f upper.txt ] && [ "$(cat upper.txt)" = "$(tr '[:lower:]' '[:upper:]' < input.txt)" ] && upper=1
echo "count=$count upper=$upper"
printf '{"count": %s, "upper": %s}\n' "$count" "$upper" > /logs/verifier/reward.json
