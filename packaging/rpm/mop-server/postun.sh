# mop-server %postun: reload units; on upgrade restart a running service on the new binary
# (what %systemd_postun_with_restart does). Data stays: rpm has no purge.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -ge 1 ]; then
    systemctl try-restart mop-server.service >/dev/null 2>&1 || :
fi
exit 0
