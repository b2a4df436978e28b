# mop-server %post: directories, and the unit enabled per the system's preset on first install
# (what %systemd_post expands to). Works where systemd is not running.
chgrp mop-server /etc/mop-server /etc/mop-server/server.toml
chmod 0750 /etc/mop-server
install -d -m 0750 -o mop-server -g mop-server /var/lib/mop-server
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
    systemctl --no-reload preset mop-server.service >/dev/null 2>&1 || :
fi
exit 0
