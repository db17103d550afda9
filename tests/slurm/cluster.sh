#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests/test_slurm.py (and by hand):
#
#   tests/slurm/cluster.sh start DIR    # writes DIR/slurm.conf, starts munged, slurmctld, slurmd
#   export SLURM_CONF=DIR/slurm.conf    # then sbatch, squeue, scancel, snakemake --profile ...
#   tests/slurm/cluster.sh stop DIR     # stops the three daemons (by their pid files in DIR)
#
# Everything lives under DIR (config, munge key and socket, state, spool, logs, pid files) and
# listens on 127.0.0.1 only; the one thing outside DIR is a link /etc/slurm/slurm.conf -> DIR's
# config while the cluster runs (see start; it refuses to start where a slurm.conf exists).
# Needs root (slurmd starts the jobs as their users) and Debian's slurmctld, slurmd,
# slurm-client and munge packages. No accounting database (slurmdbd): jobs are followed with
# squeue, which shows finished jobs for MinJobAge, an hour (see profiles/slurm/config.yaml).
# Ports: $SLURMCTLD_PORT and $SLURMD_PORT (6817 and 6818 unless set).
# `start` returns once sinfo shows the node idle; on failure it prints the daemons' logs,
# stops what it started and exits non-zero.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
action=$1
dir=$(realpath -m "$2")

stop() {
    local name pid
    for name in slurmd slurmctld munged; do
        [[ -s $dir/run/$name.pid ]] || continue
        pid=$(cat "$dir/run/$name.pid")
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 100); do  # up to 10 s, then SIGKILL
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/run/$name.pid"
    done
    # the link to this cluster's slurm.conf (start), if it is ours
    local link=/etc/slurm/slurm.conf
    if [[ -L $link && $(readlink "$link") == "$dir/slurm.conf" ]]; then
        rm -f "$link"
    fi
}

fail() {
    echo "cluster.sh: $*" >&2
    for log in "$dir"/log/*.log; do
        [[ -f $log ]] && { echo "--- $log" >&2; tail -n 20 "$log" >&2; }
    done
    stop
    exit 1
}

start() {
    [[ $(id -u) -eq 0 ]] || { echo "cluster.sh: needs root (slurmd runs the jobs)" >&2; exit 1; }
    local tool
    for tool in munged slurmctld slurmd sbatch sinfo; do
        command -v "$tool" >/dev/null || {
            echo "cluster.sh: $tool not found" \
                "(apt-get install slurmctld slurmd slurm-client munge)" >&2
            exit 1
        }
    done
    mkdir -p "$dir"/{munge,run,state,spool,log}
    chmod 700 "$dir" "$dir/munge"
    export SLURM_CONF=$dir/slurm.conf

    # munge: a fresh key and a private socket
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed" || fail "munged did not start"

    # The node as slurmd sees this machine (CPUs, RealMemory), named localhost.
    local hw cpus mem
    hw=$(slurmd -C | head -n 1)
    cpus=$(grep -o 'CPUs=[0-9]*' <<<"$hw" | cut -d= -f2)
    mem=$(grep -o 'RealMemory=[0-9]*' <<<"$hw" | cut -d= -f2)
    cat >"$SLURM_CONF" <<EOF
# written by tests/slurm/cluster.sh: one node, this machine, loopback only
ClusterName=tnmt-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
# no cgroups (containers rarely allow them): processes tracked through /proc, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# finished jobs stay visible to squeue for an hour (Snakemake's status checks use squeue)
MinJobAge=3600
ReturnToService=2
KillWait=30
NodeName=localhost NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem
PartitionName=${SLURM_TEST_PARTITION:-debug} Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

    # srun inside a job reads /etc/slurm/slurm.conf: snakemake's slurm-jobstep executor starts
    # each job's srun without the SLURM_* variables, SLURM_CONF included. Link it there for the
    # cluster's lifetime; never replace a slurm.conf of this machine.
    if [[ -L /etc/slurm/slurm.conf && ! -e /etc/slurm/slurm.conf ]]; then
        rm -f /etc/slurm/slurm.conf  # dangling: left by a cluster that was not stopped
    fi
    if [[ -e /etc/slurm/slurm.conf ]]; then
        fail "/etc/slurm/slurm.conf exists (SLURM is set up here): not replacing it"
    fi
    mkdir -p /etc/slurm
    ln -s "$SLURM_CONF" /etc/slurm/slurm.conf

    slurmctld -f "$SLURM_CONF" -i || fail "slurmctld did not start"
    slurmd -f "$SLURM_CONF" -N localhost || fail "slurmd did not start"
    local state
    for _ in $(seq 60); do
        state=$(sinfo --noheader --nodes=localhost --format=%T 2>/dev/null || true)
        [[ $state == idle ]] && return 0
        sleep 0.5
    done
    fail "node localhost not idle after 30 s (sinfo: '${state:-no answer}')"
}

case $action in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
