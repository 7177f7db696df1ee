#!/usr/bin/env bash
# Stop the local Slurm that workflow/slurm/up.sh started: cancel its jobs, then
# stop slurmd, slurmctld and munged by the PIDs up.sh recorded in
# ${ASRFLOW_SLURM_STATE:-/tmp/asrflow-slurm}/pids, wait for them to exit and
# remove the pid files. Processes it did not start (by PID) are never touched.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    exec sudo -n -E bash "$0" "$@"  # -n: fail at once where a password would be asked
fi
export PATH="/usr/sbin:/sbin:/usr/bin:/bin:${PATH}"

state="${ASRFLOW_SLURM_STATE:-/tmp/asrflow-slurm}"
piddir="${state}/pids"
export SLURM_CONF="${SLURM_CONF:-/etc/slurm/slurm.conf}"

log() { echo "[slurm-down] $*"; }

# live PID: the process exists and is not a zombie (PID 1 here may reap late).
live() {
    kill -0 "$1" 2>/dev/null || return 1
    ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# pid_of NAME: the recorded PID, when that process is alive and is NAME.
pid_of() {
    local f="${piddir}/$1.pid" pid
    [ -s "$f" ] || return 1
    pid="$(cat "$f")"
    live "$pid" || return 1
    [ "$(cat "/proc/${pid}/comm" 2>/dev/null)" = "$1" ] || return 1
    echo "$pid"
}

if [ ! -d "$piddir" ]; then
    log "no state in ${piddir}; nothing to stop"
    exit 0
fi

# Cancel the jobs first, so that no slurmstepd/job processes outlive slurmd.
if pid_of slurmctld >/dev/null; then
    jobs="$(squeue -h -o '%i' 2>/dev/null || true)"
    if [ -n "$jobs" ]; then
        log "cancelling jobs: $(echo $jobs)"
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        for _ in $(seq 1 40); do
            [ -z "$(squeue -h -t RUNNING,COMPLETING,PENDING,CONFIGURING -o '%i' 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
fi

for name in slurmd slurmctld munged; do
    if pid="$(pid_of "$name")"; then
        log "stopping ${name} (pid ${pid})"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do
            live "$pid" || break
            sleep 0.5
        done
        if live "$pid"; then
            log "${name} (pid ${pid}) still alive after 30 s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            for _ in $(seq 1 20); do
                live "$pid" || break
                sleep 0.5
            done
        fi
    elif [ -e "${piddir}/${name}.pid" ]; then
        log "${name} (pid $(cat "${piddir}/${name}.pid")) is not running"
    fi
    rm -f "${piddir}/${name}.pid"
done
log "stopped"
