# mop-server %pre: the system user and group `mop-server` before files owned by them land.
# (What %sysusers_create_compat would expand to; cargo-generate-rpm has no macros.)
getent group mop-server >/dev/null || groupadd -r mop-server
getent passwd mop-server >/dev/null || useradd -r -g mop-server -d /var/lib/mop-server -M -s /sbin/nologin -c "mop card server" mop-server
exit 0
