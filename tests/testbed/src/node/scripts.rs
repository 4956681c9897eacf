//! The shell halves of the node: entering it, setting up its namespaces, tearing it down. Plain `sh`, so the
//! teardown also runs when the test binary is gone (SIGKILL), from the reaper process it left behind.

/// `enter.sh <cgroup-root> <holder-pid> <program> <args...>`: joins the node's `daemons` cgroup in every v1
/// hierarchy, then the holder's mount and network namespaces, and execs the program (so the PID the bed knows is
/// the program's, and its parent-death signal survives both execs).
pub const ENTER: &str = r#"#!/bin/sh
root="$1"; holder="$2"; shift 2
for h in /sys/fs/cgroup/*; do
  if [ -f "$h$root/daemons/cgroup.procs" ]; then echo $$ > "$h$root/daemons/cgroup.procs" || exit 1; fi
done
exec nsenter -t "$holder" -m -n -- "$@"
"#;

/// `holder.sh <cgroup-root>`: the process that owns the node's mount and network namespaces: private mount
/// propagation, so nothing mounted inside shows on the host, and everything goes when it and the node's
/// processes are gone.
pub const HOLDER: &str = r#"#!/bin/sh
root="$1"
for h in /sys/fs/cgroup/*; do
  if [ -f "$h$root/daemons/cgroup.procs" ]; then echo $$ > "$h$root/daemons/cgroup.procs" || exit 1; fi
done
exec unshare --mount --net --propagation private -- sleep infinity
"#;

/// `setup.sh <node-dir> <node-ip>`, run inside the namespaces: loopback, a veth pair (both ends inside, there is
/// no route out) carrying the node's /32 address, the per-node directories over the paths kubelet, the CNI
/// plugins and iptables hard-code, and files over the global sysctls kubelet writes, holding the values it wants
/// (so it reads them and writes nothing; the host's values never change).
pub const SETUP: &str = r#"#!/bin/sh
set -eu
dir="$1"; ip_addr="$2"
ip link set lo up
ip link add kk0 type veth peer name kk1
ip addr add "$ip_addr/32" dev kk0
ip link set kk0 up
ip link set kk1 up
mkdir -p "$dir/run" "$dir/var-lib" "$dir/sysctl"
mount --bind "$dir/run" /run
mount --bind "$dir/var-lib" /var/lib
while read -r key value; do
  file="$dir/sysctl/$(echo "$key" | tr / .)"
  echo "$value" > "$file"
  mount --bind "$file" "/proc/sys/$key"
done <<EOF
vm/overcommit_memory 1
vm/panic_on_oom 0
kernel/panic 10
kernel/panic_on_oops 1
kernel/keys/root_maxkeys 1000000
kernel/keys/root_maxbytes 25000000
EOF
"#;

/// `reaper.sh <cgroup-root> <created-list> <node-dir>`: waits until its stdin closes (the bed dropped the node, or
/// the test binary died, even by SIGKILL), then kills every process in the node's cgroups (daemons, shims,
/// containers) until none is left, removes those cgroups depth-first and the parent cgroups the bed created
/// (listed in `<created-list>`, removed newest first, only if empty), and any empty parent left by an overlapping
/// node, outside the memory hierarchy. The namespaces and their mounts, iptables rules and interfaces go with the
/// last process in them. Once no process is left, it removes the node's state from `<node-dir>` (containerd's
/// images and snapshots, the kubelet's pods, etcd, the peers' data, the image archives: 0.5 to 3 GiB a node), so a
/// full run's disk holds one live node per lane, not every node it started; the logs, the pod logs and the small
/// files (kubeconfigs, pki, scripts, the seed's manifests) stay for reading after a failure. `--one-file-system`
/// never follows a mount that outlived its namespace.
pub const REAPER: &str = r#"#!/bin/sh
root="$1"; created="$2"; dir="$3"
cat > /dev/null
echo "reaper: tearing down $root"
procs() {
  for h in /sys/fs/cgroup/*; do
    [ -d "$h$root" ] && find "$h$root" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
}
empty=0; i=0
while [ $i -lt 300 ]; do
  pids=$(procs | sort -u | tr '\n' ' ')
  if [ -z "${pids% }" ]; then
    empty=$((empty + 1)); [ $empty -ge 2 ] && break
  else
    empty=0; kill -9 $pids 2>/dev/null
  fi
  i=$((i + 1)); sleep 0.05
done
j=0
while [ $j -lt 100 ]; do
  left=0
  for h in /sys/fs/cgroup/*; do
    if [ -d "$h$root" ]; then
      find "$h$root" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$h$root" ] && left=1
    fi
  done
  [ $left -eq 0 ] && break
  j=$((j + 1)); sleep 0.05
done
if [ -f "$created" ]; then
  tac "$created" | while read -r d; do rmdir "$d" 2>/dev/null || true; done
fi
# Parents another node made while this one ran (and could not remove then, as this one still used them): empty
# ones go too, except in the memory hierarchy, where the parent is the session's own cgroup.
prefix="${root%/*}"
for h in /sys/fs/cgroup/*; do
  case "$h" in *memory*) continue ;; esac
  d="$h$prefix"
  while [ "$d" != "$h" ] && [ -d "$d" ]; do rmdir "$d" 2>/dev/null || break; d="${d%/*}"; done
done
if [ $left -ne 0 ]; then echo "reaper: cgroups left under $root"; exit 1; fi
if [ -n "$dir" ] && [ -d "$dir" ]; then
  for d in containerd kubelet etcd peers var-lib run; do rm -rf --one-file-system "$dir/$d" 2>/dev/null; done
  rm -f "$dir"/*.tar
  for d in containerd kubelet etcd peers; do [ -e "$dir/$d" ] && echo "reaper: could not remove $dir/$d"; done
fi
echo "reaper: done"
"#;

/// `netpol-cleanup.sh`, run inside the node once kube-router is stopped: removes its firewall (the jumps from the
/// built-in chains, then its chains, then its ipsets). Its own `--cleanup-config` (v2.1.0) cleans a controller it
/// never gave iptables handlers, so it removes nothing. One `iptables -w` command per change, never a whole-table
/// restore, so kube-proxy's concurrent changes are kept.
pub const NETPOL_CLEANUP: &str = r#"#!/bin/sh
set -eu
ours='KUBE-(ROUTER|NWPLCY|POD-FW)-'
iptables-save -t filter | grep -E "^-A (INPUT|FORWARD|OUTPUT) .*-j $ours" | sed 's/^-A/-D/' | while read -r rule; do
  eval "iptables -w -t filter $rule"
done
chains=$(iptables-save -t filter | sed -n -E "s/^:($ours[^ ]*) .*/\\1/p")
for c in $chains; do iptables -w -t filter -F "$c"; done
for c in $chains; do iptables -w -t filter -X "$c"; done
for s in $(ipset list -n | grep -E '^KUBE-(SRC|DST)-' || true); do ipset destroy "$s"; done
left=$(iptables-save -t filter | grep -cE "$ours" || true)
[ "$left" -eq 0 ] || { echo "kube-router left $left iptables lines"; exit 1; }
"#;
