# mopd %pre: the system user and group `mop` before files owned by them land.
# (What %sysusers_create_compat would expand to; cargo-generate-rpm has no macros.)
getent group mop >/dev/null || groupadd -r mop
getent passwd mop >/dev/null || useradd -r -g mop -d /var/lib/mopd -M -s /sbin/nologin -c "mop host daemon" mop
exit 0
