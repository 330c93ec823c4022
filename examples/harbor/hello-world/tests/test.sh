#!/bin/bash
# Harbor's verifier: runs in the agent's container after the agent; the reward is the score.
mkdir -p /logs/verifier
if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ]; then
    echo "hello.txt holds the greeting"
    echo 1 > /logs/verifier/reward.txt
else
    echo "hello.txt is missing or holds something else"
    echo 0 > /logs/verifier/reward.txt
fi
