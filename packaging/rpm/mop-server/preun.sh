# mop-server %preun: on the last erase, stop and disable the unit (what %systemd_preun does).
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now mop-server.service >/dev/null 2>&1 || :
fi
exit 0
