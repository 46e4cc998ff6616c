#!/usr/bin/env bash
# A cluster of simulated hosts on this machine, for the multi-host tests and benchmarks.
#
#   bash scripts/cluster.sh up N [RATE]   # hosts hc1..hcN at 10.78.0.1..N; RATE caps each host's link
#                                         # both ways with tc tbf (e.g. 1gbit, 500mbit)
#   bash scripts/cluster.sh down          # removes everything `up` made, by name and by PID
#   bash scripts/cluster.sh status        # the hosts that are up, one "NAME ADDRESS" per line
#
# HOROVOD_COMPAT_CLUSTER_NAMES=resolvable makes each host's /etc/hosts name every host at its real
# address instead (no 127.0.1.1 line): real Horovod 0.28.1's gloo needs that (on Debian's layout
# its ranks connect to 127.0.1.1), so benchmarks/multihost_allreduce.py --horovod-python uses it.
#
# Each host is a network namespace on the bridge hcbr0 (this machine is 10.78.0.254 there) with
# its own host name (UTS namespace), IPC, a private /dev/shm and its own /etc/hosts as Debian
# writes it (its own name -> 127.0.1.1: the name does not reach the others, as on many clusters)
# and no name server or default route (it reaches the other hosts and this machine, nothing else),
# all held by a real sshd running in them (openssh-server, installed from Debian's packages when
# missing). Everything started over ssh on a host lives in its namespaces; the file system is
# shared, so the same Python, project and user code are on every host, as a cluster needs.
#
# ssh reaches the hosts by address with the cluster's own key: `up` writes a client block for
# 10.78.0.* to /etc/ssh/ssh_config.d/ (identity, known host keys), so `ssh 10.78.0.1`, horovodrun
# and mpirun need no options; `down` removes it. Needs root. State lives in $HOROVOD_COMPAT_CLUSTER_DIR
# (default /run/horovod-compat-cluster). Traffic goes only to the namespaces' own addresses.
set -euo pipefail

state="${HOROVOD_COMPAT_CLUSTER_DIR:-/run/horovod-compat-cluster}"
prefix=10.78.0
bridge=hcbr0
client_config=/etc/ssh/ssh_config.d/horovod-compat-cluster.conf
max_hosts=16

die() { echo "cluster: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, a bridge and sshd); run it as root"
}

ensure_sshd() {
  if [ -x /usr/sbin/sshd ]; then return; fi
  echo "cluster: installing openssh-server (Debian's package)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null
  }
  # the package's own service is not ours: stop whatever it started
  if command -v systemctl >/dev/null 2>&1; then systemctl stop ssh >/dev/null 2>&1 || true; fi
  [ -x /usr/sbin/sshd ] || die "openssh-server did not install /usr/sbin/sshd"
}

wait_for_port() {  # ADDRESS PORT SECONDS
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

up() {
  local n="$1" rate="${2:-}"
  need_root
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le "$max_hosts" ] ||
    die "up N: N must be a number of hosts from 1 to $max_hosts, got '$n'"
  if [ -n "$rate" ] && ! [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]]; then
    die "up N RATE: RATE is a tc rate such as 1gbit or 500mbit, got '$rate'"
  fi
  if [ -e "$state/hosts" ]; then die "a cluster is up already ($state); run: $0 down"; fi
  if ip -4 route show | grep -q "^$prefix\."; then
    die "$prefix.0/24 is routed on this machine already (not by this script): $(ip -4 route show | grep "^$prefix\.")"
  fi
  ensure_sshd
  mkdir -p "$state" /run/sshd
  chmod 700 "$state"
  : > "$state/hosts"
  trap 'echo "cluster: up failed; cleaning up" >&2; down >/dev/null 2>&1 || true' ERR
  ssh-keygen -q -t ed25519 -N "" -C horovod-compat-cluster -f "$state/id_ed25519"
  cp "$state/id_ed25519.pub" "$state/authorized_keys"
  ssh-keygen -q -t ed25519 -N "" -C horovod-compat-cluster-host -f "$state/host_key"
  echo "$prefix.* $(cut -d' ' -f1,2 "$state/host_key.pub")" > "$state/known_hosts"
  ip link add "$bridge" type bridge
  ip addr add "$prefix.254/24" dev "$bridge"
  ip link set "$bridge" up
  local i
  for i in $(seq 1 "$n"); do
    local name="hc$i" addr="$prefix.$i"
    ip netns add "$name"
    ip link add "hcv$i" type veth peer name eth0 netns "$name"
    ip link set "hcv$i" master "$bridge"
    ip link set "hcv$i" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr/24" dev eth0
    ip -n "$name" link set eth0 up
    # no default route: a host reaches the other hosts and this machine, nothing else
    if [ -n "$rate" ]; then  # both ways: the host's upload, and what the bridge sends it
      ip netns exec "$name" tc qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 100ms
      tc qdisc add dev "hcv$i" root tbf rate "$rate" burst 1mb latency 100ms
    fi
    if [ "${HOROVOD_COMPAT_CLUSTER_NAMES:-debian}" = resolvable ]; then
      { printf '127.0.0.1\tlocalhost\n'; for j in $(seq 1 "$n"); do printf '%s.%s\thc%s\n' "$prefix" "$j" "$j"; done; } \
        > "$state/$name.etc-hosts"
    else
      printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$name" > "$state/$name.etc-hosts"
    fi
    # no name server: a lookup of a name /etc/hosts lacks fails at once instead of timing out
    printf 'options timeout:1 attempts:1\n' > "$state/$name.resolv.conf"
    cat > "$state/$name.sshd_config" <<EOF
ListenAddress $addr
Port 22
HostKey $state/host_key
AuthorizedKeysFile $state/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $state/$name.sshd.pid
MaxStartups 200
MaxSessions 200
EOF
    # sshd holds the host's namespaces: new UTS (host name), IPC and mount (private /dev/shm,
    # the host's own /etc/hosts); everything it starts inherits them.
    setsid ip netns exec "$name" unshare --uts --ipc --mount --propagation private sh -c "
      hostname $name
      mount -t tmpfs -o size=4g tmpfs /dev/shm
      mount --bind $state/$name.etc-hosts /etc/hosts
      mount --bind $state/$name.resolv.conf /etc/resolv.conf
      exec /usr/sbin/sshd -D -f $state/$name.sshd_config -E $state/$name.sshd.log" \
      </dev/null >/dev/null 2>&1 &
    echo "$!" > "$state/$name.holder.pid"
    echo "$name $addr" >> "$state/hosts"
  done
  cat > "$client_config" <<EOF
# Written by horovod-compat's scripts/cluster.sh; removed by 'cluster.sh down'.
Host $prefix.*
    User root
    IdentityFile $state/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $state/known_hosts
    StrictHostKeyChecking yes
    LogLevel ERROR
EOF
  while read -r name addr; do
    wait_for_port "$addr" 22 20 || die "sshd on $name ($addr) did not start: $(tail -n 3 "$state/$name.sshd.log" 2>/dev/null)"
    got=$(ssh -o BatchMode=yes -o ConnectTimeout=10 "$addr" hostname) ||
      die "ssh $addr hostname failed"
    [ "$got" = "$name" ] || die "ssh $addr reached '$got', not $name"
  done < "$state/hosts"
  trap - ERR
  cat "$state/hosts"
}

down() {
  need_root
  local name
  for name in $(ip netns list 2>/dev/null | awk '$1 ~ /^hc[0-9]+$/ {print $1}'); do
    # every process of the host: sshd, and what was started through it
    local pids
    pids=$(ip netns pids "$name" 2>/dev/null || true)
    if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
    ip netns del "$name" 2>/dev/null || true
  done
  if [ -d "$state" ]; then
    for pidfile in "$state"/*.holder.pid; do
      [ -e "$pidfile" ] || continue
      kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
    done
  fi
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^hcv[0-9]+$' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  rm -f "$client_config"
  rm -rf "$state"
}

status() {
  if [ -e "$state/hosts" ]; then cat "$state/hosts"; fi
}

case "${1:-}" in
  up) shift; [ $# -ge 1 ] || die "usage: $0 up N [RATE]"; up "$@" ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 up N [RATE] | down | status" ;;
esac
