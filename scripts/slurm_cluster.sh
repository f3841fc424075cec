#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for tests/workflow/test_slurm_cluster.py:
# slurmctld + slurmd + slurmdbd (accounting: Snakemake's SLURM plugin asks `sacct` for job states)
# on MariaDB, authenticated by munge. Debian/Ubuntu packages, run as root, no systemd needed.
#
#   scripts/slurm_cluster.sh up      install what is missing, write the configs, start the daemons
#   scripts/slurm_cluster.sh down    cancel every job, stop the daemons (packages stay installed)
#   scripts/slurm_cluster.sh status  0 when the node answers and accepts jobs
#
# Both directions are idempotent: `up` on a running cluster only checks it, `down` on a stopped one
# does nothing. Configs go to /etc/slurm and are this cluster's alone: do not run it on a machine
# that is part of another SLURM cluster.
set -euo pipefail

CLUSTER=zerobench
PARTITION=cpu
CONF=/etc/slurm
STATE=/var/lib/slurm-zerobench
LOGS=/var/log/slurm-zerobench
RUN=/run/slurm-zerobench
PACKAGES=(munge mariadb-server slurmctld slurmd slurmdbd slurm-client)

say() { echo "slurm_cluster: $*"; }
die() { echo "slurm_cluster: error: $*" >&2; exit 1; }

# Wait up to $1 seconds for the command after it to succeed.
wait_for() {
  local seconds=$1
  shift
  for _ in $(seq "$((seconds * 2))"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

install_missing() {
  local missing=()
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "packages present: ${PACKAGES[*]}"
    return
  fi
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
  say "installing ${missing[*]} (apt-get, about 2 minutes)"
  apt-get update -qq
  # No daemon starts from the packages' own scripts: this script starts them itself.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
}

write_configs() {
  local host node mem_mb
  host=$(hostname -s)
  # The node as slurmd sees it (CPUs, sockets, cores), less 1 GiB of memory for the system.
  node=$(slurmd -C | head -1 | sed 's/ RealMemory=.*//')
  mem_mb=$(($(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024))
  mkdir -p "$CONF" "$STATE/ctld" "$STATE/d" "$LOGS" "$RUN"
  # Daemons run as root (SlurmUser=root): a throwaway test cluster, no service accounts to set up.
  # No cgroup plugins (the machine may be a container): processes are tracked through /proc.
  cat >"$CONF/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$host
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Quick turnaround for tests: finished jobs leave the controller's memory after 60 s (sacct keeps them).
MinJobAge=60
KillWait=5
InactiveLimit=0
$node RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  cat >"$CONF/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$host
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=zerobench
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$CONF/slurmdbd.conf"
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "munge running"
    return
  fi
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 sh -c 'munge -n | unmunge' || die "munged did not start (see /var/log/munge/munged.log)"
}

start_mariadb() {
  if mysqladmin ping >/dev/null 2>&1; then
    say "mariadb running"
  else
    say "starting mariadb"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    (mysqld_safe >/dev/null 2>&1 &)
    wait_for 60 mysqladmin ping || die "mariadb did not start (see /var/log/mysql/)"
  fi
  mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'zerobench';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
}

# Start daemon $1 unless its pid file names a live process; then wait for `$2...` to succeed.
start_daemon() {
  local name=$1
  shift
  if [ -s "$RUN/$name.pid" ] && kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null; then
    say "$name running"
    return
  fi
  say "starting $name"
  "/usr/sbin/$name"
  wait_for 60 "$@" || die "$name did not come up (see $LOGS/$name.log)"
}

up() {
  [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts daemons)"
  local t0=$SECONDS
  install_missing
  write_configs
  start_munge
  start_mariadb
  start_daemon slurmdbd sacctmgr -i list cluster
  # The cluster must be known to accounting before slurmctld registers with it.
  sacctmgr -i list cluster -n format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  start_daemon slurmctld scontrol ping
  start_daemon slurmd sh -c "sinfo -h -N -o %t | grep -qE '^(idle|mix|alloc)'"
  say "up in $((SECONDS - t0)) s: partition $PARTITION, node $(hostname -s), $(nproc) CPUs"
}

stop_pidfile() {
  local name=$1 pid
  [ -s "$RUN/$name.pid" ] || return 0
  pid=$(cat "$RUN/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping $name ($pid)"
    kill "$pid"
    wait_for 30 sh -c "! kill -0 $pid" || kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/$name.pid"
}

down() {
  if command -v scancel >/dev/null && scontrol ping >/dev/null 2>&1; then
    say "cancelling every job"
    scancel --full --quiet "--user=$(id -un)" || true
    wait_for 30 sh -c '[ -z "$(squeue -h)" ]' || say "jobs still listed after 30 s"
  fi
  stop_pidfile slurmd
  stop_pidfile slurmctld
  stop_pidfile slurmdbd
  if mysqladmin ping >/dev/null 2>&1; then
    say "stopping mariadb"
    mysqladmin shutdown
  fi
  if [ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
    say "stopping munged"
    kill "$(cat /run/munge/munged.pid)"
  fi
  say "down"
}

status() {
  command -v sinfo >/dev/null || { say "not installed"; return 1; }
  scontrol ping >/dev/null 2>&1 || { say "slurmctld not answering"; return 1; }
  sacctmgr -i list cluster -n >/dev/null 2>&1 || { say "slurmdbd not answering"; return 1; }
  sinfo -h -N -o "%N %t %c CPUs" | sed 's/^/slurm_cluster: node /'
  sinfo -h -N -o %t | grep -qE '^(idle|mix|alloc)'
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 up|down|status" ;;
esac
