# mopd %post: directories, and the unit enabled per the system's preset on first install
# (what %systemd_post expands to). Works where systemd is not running.
chgrp mop /etc/mopd /etc/mopd/mopd.toml
chmod 0750 /etc/mopd
install -d -m 0750 -o mop -g mop /var/cache/mopd /var/lib/mopd
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
    systemctl --no-reload preset mopd.service >/dev/null 2>&1 || :
fi
exit 0
