#!/usr/bin/env bash
# Multi-node runs on a Ray cluster: start the head, join workers, submit the training job.
#
#   on the head node:      bash scripts/multinode.sh head
#   on every other node:   bash scripts/multinode.sh worker HEAD_IP
#   on the head node:      bash scripts/multinode.sh submit trainer.nnodes=2 \
#                              trainer.n_gpus_per_node=8 data.train_files=[...] ...
#   anywhere, to stop:     bash scripts/multinode.sh stop
#
# The job runs `python -m verl.trainer.main_ppo` with trainer.backend=ray and
# trainer.ray_address=auto, so the driver joins the running cluster instead of starting
# one; VERL_TRAINER=sft (or dpo) submits `main_sft` (`main_dpo`) the same way. The dashboard (needed by `ray job submit`) binds to 127.0.0.1 unless
# VERL_DASHBOARD_HOST says otherwise; reach it through an SSH tunnel. Needs the `ray`
# extra (`pip install 'verl[ray]'`, which includes the dashboard) on every node, the same
# Python environment and the model/data paths visible on every node.
#
# Token authentication is on (RAY_AUTH_MODE=token for every command): `head` creates the
# cluster's token in ~/.ray/auth_token if missing; copy that file to every worker node (and
# to any machine that submits) before `worker`. Ray's services listen on all interfaces of a
# node (Ray can bind them to loopback only, not to one address): the token is what keeps
# others out, so keep the cluster on a private network as well.
#
# Env: VERL_TRAINER (ppo; sft, dpo), VERL_RAY_PORT (6379), VERL_DASHBOARD_HOST (127.0.0.1), VERL_DASHBOARD_PORT (8265),
#      VERL_NUM_CPUS / VERL_NUM_GPUS (Ray's auto-detection when unset), PYTHON (python3).
set -euo pipefail
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

port="${VERL_RAY_PORT:-6379}"
dash_host="${VERL_DASHBOARD_HOST:-127.0.0.1}"
dash_port="${VERL_DASHBOARD_PORT:-8265}"
python_bin="${PYTHON:-python3}"
resources=()
[ -n "${VERL_NUM_CPUS:-}" ] && resources+=(--num-cpus "$VERL_NUM_CPUS")
[ -n "${VERL_NUM_GPUS:-}" ] && resources+=(--num-gpus "$VERL_NUM_GPUS")

usage() {
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

cmd="${1:-}"
[ -n "$cmd" ] || usage
shift

case "$cmd" in
    head)
        [ "$RAY_AUTH_MODE" != token ] || ray get-auth-token --generate >/dev/null
        ray start --head --port="$port" \
            --dashboard-host="$dash_host" --dashboard-port="$dash_port" "${resources[@]}"
        ;;
    worker)
        head_ip="${1:?usage: multinode.sh worker HEAD_IP}"
        ray start --address="$head_ip:$port" "${resources[@]}"
        ;;
    submit)
        # no --working-dir: verl is installed in every node's environment
        case "${VERL_TRAINER:-ppo}" in
            ppo) entry=(verl.trainer.main_ppo trainer.backend=ray) ;;
            sft | dpo) entry=("verl.trainer.main_${VERL_TRAINER}") ;;
            *) echo "VERL_TRAINER=$VERL_TRAINER: use ppo, sft or dpo" >&2; exit 2 ;;
        esac
        ray job submit --address="http://$dash_host:$dash_port" -- \
            "$python_bin" -m "${entry[@]}" trainer.ray_address=auto "$@"
        ;;
    stop)
        ray stop
        ;;
    *)
        usage
        ;;
esac
