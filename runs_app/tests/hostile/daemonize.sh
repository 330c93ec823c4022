# Leaves two processes behind and exits at once: one that only left the session, and one that
# also cleared its environment (invisible to an environment-token search).
setsid sh -c 'echo $$ > daemon.pid; exec sleep 30' < /dev/null > /dev/null 2>&1 &
env -i /usr/bin/setsid -f /bin/sh -c 'echo $$ > scrubbed.pid; exec sleep 30' < /dev/null > /dev/null 2>&1
sleep 0.3
echo started
