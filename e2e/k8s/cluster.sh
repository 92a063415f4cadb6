#!/usr/bin/env bash
# Runs a real Kubernetes control plane on loopback for the end-to-end tests:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake
# nodes and pods), from the binaries built by build.sh.
#
# Usage:
#   cluster.sh up DIR [--nodes N] [--real-node]
#                                        start everything, state and logs in DIR; with
#                                        --real-node also a real node (containerd, kubelet,
#                                        kube-proxy; root only; see real-node.sh)
#   cluster.sh import-images DIR FILE... import OCI archives into the real node's containerd
#   cluster.sh add-node DIR NAME...      create more kwok nodes, wait until Ready
#   cluster.sh restart-apiserver DIR [--down-secs S] [--graceful]
#                                        kill kube-apiserver (SIGKILL; SIGTERM
#                                        with --graceful, which takes ~10 s),
#                                        wait S seconds (default 0), start it
#                                        again with the same flags
#   cluster.sh stop-etcd DIR [--down-secs S]
#                                        kill etcd (SIGKILL), wait S seconds
#                                        (default 10), start it again with the
#                                        same flags and data; returns once
#                                        kube-apiserver is ready again
#   cluster.sh save-etcd DIR TO          stop etcd (SIGTERM: its last writes are on disk),
#                                        copy its data directory to TO (replaced whole),
#                                        start it again; returns once kube-apiserver is
#                                        ready again. `up` with EBB_K8S_ETCD_RESTORE=TO
#                                        starts from that copy (a bench's populated cluster
#                                        in seconds)
#   cluster.sh stop-controllers DIR      stop kube-controller-manager (SIGTERM)
#   cluster.sh stop-kwok DIR             stop kwok (every shard): nodes keep their last status
#                                        and pods are no longer started or ended, until the
#                                        node monitor's grace period marks the nodes lost
#   cluster.sh start-controllers DIR     start it again with the same flags: its caches list
#                                        everything at once before any controller runs (a
#                                        bench writes its objects to etcd in between, so no
#                                        controller acts on half of them)
#   cluster.sh down DIR                  stop what `up` started (logs stay in DIR)
#
# `up` returns when /readyz is ok, the N nodes (kwok-node-0..N-1) are Ready
# and the `default` ServiceAccount exists. It writes:
#   DIR/kubeconfig   cluster-admin kubeconfig (certificates embedded)
#   DIR/env          shell-sourceable: KUBECONFIG, EBB_K8S_* (ports, URL, bin dir)
#   DIR/audit.log    API audit log (JSON lines): every write (create, update,
#                    patch, delete) but node Lease renewals; evictions and node
#                    writes with their request bodies, pod and PodDisruptionBudget
#                    writes with their responses
#   DIR/<component>.log, DIR/pids/<component>.{pid,cmd}
# With --real-node, DIR/env also names EBB_K8S_REAL_NODE (the node; labelled and tainted
# EBB_K8S_REAL_NODE_LABEL=true, NoSchedule), EBB_K8S_CONTAINERD_ADDRESS (containerd's socket;
# images in namespace k8s.io) and EBB_K8S_PAUSE_IMAGE (imported, runnable), and the API
# server listens on the node's address instead of 127.0.0.1 (the kubeconfigs say which).
#
# kwok leaves the status of a node or pod annotated or labelled
# ebb.dev/e2e-unmanaged=true alone: a test marks a node lost by annotating it and
# writing its Ready condition False (no heartbeat puts it back); a bench labels
# pods that never move and whose status it writes itself.
#
# Environment:
#   EBB_K8S_BIN_DIR          binaries (default: `build.sh --print-bin-dir`)
#   EBB_K8S_ETCD_ARGS        extra etcd flags (word-split)
#   EBB_K8S_ETCD_RESTORE     a data directory `save-etcd` wrote: `up` copies it and starts etcd
#                            on the copy (every object it held is there at once; kwok takes over
#                            the nodes it finds)
#   EBB_K8S_APISERVER_ARGS   extra kube-apiserver flags (word-split)
#   EBB_K8S_CONTROLLER_MANAGER_ARGS, EBB_K8S_SCHEDULER_ARGS, EBB_K8S_KWOK_ARGS
#   EBB_K8S_KWOK_PARALLELISM workers kwok plays node stages and renews leases with
#                            (default kwok's 4)
#   EBB_K8S_KWOK_PROFILE_ADDR 127.0.0.1:PORT: kwok serves /debug/pprof there (shard K of
#                            EBB_K8S_KWOK_SHARDS at PORT+K)
#   EBB_K8S_KWOK_SHARDS      kwok processes (default 1). With N > 1, kwok (shard 0) and
#                            kwok-1..kwok-N-1 each manage the nodes labelled
#                            ebb.dev/kwok-shard=<K> and their pods: every kwok reads every
#                            pod event, but plays stages only for its own nodes' pods, on
#                            its own goroutines (one kwok matches all pods' events against
#                            its stages in a single goroutine, which bounds a large cluster's
#                            pod starts). Nodes `up` and `add-node` create get the label
#                            (the number in their name, or else a checksum of it, modulo N);
#                            a bench that writes nodes itself sets it.
#   EBB_K8S_KWOK_POD_PARALLELISM
#                            workers kwok plays pod stages with (default kwok's 4). More
#                            start a bulk of pods sooner, but at 16 kwok played one pod's
#                            stages concurrently, patched new pods hundreds of times and
#                            left some ContainerCreating for minutes: raise it only to
#                            populate a cluster, never where pods are measured
#   EBB_K8S_POD_DELAY_MS, EBB_K8S_POD_JITTER_MS
#                            KWOK pod stage (create, ready, complete) delay and
#                            maximum delay, default 100 and 500 ms (KWOK's own:
#                            1000 and 5000); a terminating pod is removed at its
#                            deletionTimestamp (i.e. after its grace period).
#                            A pod annotated ebb.dev/e2e-never-ready=true (and
#                            pod-ready.stage.kwok.x-k8s.io/weight=0) starts
#                            Running but never becomes Ready; per-pod delays
#                            of kwok's pod-ready stage come from its annotations
#                            pod-ready.stage.kwok.x-k8s.io/delay and jitter-delay
#   EBB_K8S_TIMEOUT          seconds to wait for readiness once booting (default 120)
#   EBB_K8S_BOOT_LOCK        a file `up` holds a lock on while it boots (default
#                            /tmp/ebb-k8s-boot.lock): control planes boot one at a time on
#                            the machine, so test binaries that start several at once do
#                            not starve each other's API server past its timeout; `none`
#                            boots at once
#   EBB_K8S_BOOT_LOCK_WAIT   seconds `up` waits for that lock (default 900)
#   EBB_K8S_AUDIT_READS_OF   comma-separated users whose reads (get, list, watch) the
#                            audit log also records, at Metadata level (default none), so a
#                            bench can count a client's requests
#   EBB_K8S_AUDIT_SKIP_NAMESPACES
#                            comma-separated namespaces whose objects' writes the audit
#                            log leaves out (default none): a bench's bulk objects
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN_DIR=${EBB_K8S_BIN_DIR:-$("$HERE/build.sh" --print-bin-dir)}
STAGE_DIR=$(dirname "$BIN_DIR")/kwok-stages
TIMEOUT=${EBB_K8S_TIMEOUT:-120}
BOOT_LOCK=${EBB_K8S_BOOT_LOCK:-/tmp/ebb-k8s-boot.lock}
BOOT_LOCK_WAIT=${EBB_K8S_BOOT_LOCK_WAIT:-900}
# the file descriptor of the boot lock; the components started never inherit it
BOOT_FD=9
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
# delay and jitter (max delay) of each KWOK pod stage, except deletion
POD_DELAY_MS=${EBB_K8S_POD_DELAY_MS:-100}
POD_JITTER_MS=${EBB_K8S_POD_JITTER_MS:-500}
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
# where kube-apiserver listens; the real node's address with --real-node
APISERVER_HOST=127.0.0.1
# shellcheck source=real-node.sh
source "$HERE/real-node.sh"

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }
now_ms() { date +%s%3N; }

kubectl_() { "$BIN_DIR/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"; }

bin_of() { # NAME: the binary a component runs (containerd is the system's; kwok-K is kwok)
  case $1 in
  containerd) command -v containerd ;;
  kwok-[0-9]*) echo "$BIN_DIR/kwok" ;;
  *) echo "$BIN_DIR/$1" ;;
  esac
}

KWOK_SHARD_LABEL=ebb.dev/kwok-shard
kwok_shards() { # the number of kwok processes
  local n=${EBB_K8S_KWOK_SHARDS:-1}
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "EBB_K8S_KWOK_SHARDS must be a positive number"
  echo "$n"
}
kwok_extra_shards() { # NAME of each kwok-K recorded in DIR/pids
  local f
  for f in "$DIR"/pids/kwok-[0-9]*.pid; do
    [[ -e $f ]] || continue
    f=${f##*/}
    echo "${f%.pid}"
  done
}
shard_of() { # NAME: the kwok shard a node goes to (its number, or a checksum, modulo shards)
  local n
  n=$(kwok_shards)
  if [[ $1 =~ ([0-9]+)$ ]]; then
    echo $((10#${BASH_REMATCH[1]} % n))
  else
    echo $(($(cksum <<<"$1" | cut -d' ' -f1) % n))
  fi
}

# ---------------------------------------------------------------- processes

pid_alive() { # NAME: true if the recorded process is still ours
  local f=$DIR/pids/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ -r /proc/$pid/cmdline ]] || return 1
  # same process: argv[0] is our binary and the command mentions DIR
  local cmdline
  cmdline=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ $(head -n1 <<<"$cmdline") == "$(bin_of "$1")" ]] && grep -qF -- "$DIR" <<<"$cmdline"
}

start() { # NAME ARGS...: start BIN_DIR/NAME in the background, record pid and command
  local name=$1
  shift
  local cmd=("$(bin_of "$name")" "$@")
  printf '%q ' "${cmd[@]}" >"$DIR/pids/$name.cmd"
  echo "=== $(date -u +%FT%TZ) starting: ${cmd[*]}" >>"$DIR/$name.log"
  "${cmd[@]}" </dev/null >>"$DIR/$name.log" 2>&1 9>&- &
  echo $! >"$DIR/pids/$name.pid"
}

restart_recorded() { # NAME: start again from DIR/pids/NAME.cmd
  local name=$1
  local -a cmd
  eval "cmd=($(<"$DIR/pids/$name.cmd"))"
  echo "=== $(date -u +%FT%TZ) restarting: ${cmd[*]}" >>"$DIR/$name.log"
  "${cmd[@]}" </dev/null >>"$DIR/$name.log" 2>&1 9>&- &
  echo $! >"$DIR/pids/$name.pid"
}

boot_lock() { # hold BOOT_LOCK (on fd 9) until this script exits: one boot at a time
  [[ $BOOT_LOCK == none ]] && return 0
  command -v flock >/dev/null 2>&1 || { log "flock not found: booting without the boot lock"; return 0; }
  exec 9>>"$BOOT_LOCK" || die "cannot open the boot lock $BOOT_LOCK (set EBB_K8S_BOOT_LOCK)"
  if ! flock -n "$BOOT_FD"; then
    local t_wait
    t_wait=$(now_ms)
    log "waiting for another control plane to finish booting ($BOOT_LOCK)"
    flock -w "$BOOT_LOCK_WAIT" "$BOOT_FD" ||
      die "another control plane held $BOOT_LOCK for more than ${BOOT_LOCK_WAIT}s (EBB_K8S_BOOT_LOCK_WAIT)"
    log "boot lock taken after $((($(now_ms) - t_wait) / 1000))s"
  fi
}

stop() { # NAME [SIGNAL]: SIGTERM (or SIGNAL), then SIGKILL after 10 s
  local name=$1 sig=${2:-TERM} pid i
  pid_alive "$name" || { rm -f "$DIR/pids/$name.pid"; return 0; }
  pid=$(<"$DIR/pids/$name.pid")
  kill "-$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    pid_alive "$name" || break
    sleep 0.1
  done
  if pid_alive "$name"; then
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      pid_alive "$name" || break
      sleep 0.1
    done
  fi
  # a child of this shell: reap it quietly
  wait "$pid" 2>/dev/null || true
  rm -f "$DIR/pids/$name.pid"
}

stop_all() {
  local i name
  real_down
  for name in $(kwok_extra_shards); do stop "$name"; done
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[$i]}"; done
}

fail() { # NAME MESSAGE: show the component's log, stop everything (during up), exit 1
  echo "cluster.sh: error: $2" >&2
  if [[ -n $1 && -f $DIR/$1.log ]]; then
    echo "---- last 30 lines of $DIR/$1.log ----" >&2
    tail -n 30 "$DIR/$1.log" >&2
    echo "----" >&2
  fi
  [[ ${STOP_ON_FAIL:-0} == 1 ]] && stop_all
  exit 1
}

check_started() { # fail if a started component died
  local name
  for name in "${COMPONENTS[@]}" $(kwok_extra_shards) "${REAL_COMPONENTS[@]}"; do
    if [[ -f $DIR/pids/$name.pid ]] && ! pid_alive "$name"; then
      fail "$name" "$name exited during startup"
    fi
  done
}

wait_for() { # WHAT COMMAND...: poll until COMMAND succeeds, failing on dead components
  local what=$1 deadline=$((SECONDS + TIMEOUT))
  shift
  until "$@" >/dev/null 2>&1; do
    check_started
    ((SECONDS < deadline)) || fail "" "timed out after ${TIMEOUT}s waiting for $what"
    sleep 0.2
  done
}

free_ports() { # N: print N distinct free loopback TCP ports
  if command -v python3 >/dev/null 2>&1; then
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
  else
    local ports=() p
    while ((${#ports[@]} < $1)); do
      p=$((20000 + RANDOM % 30000))
      [[ " ${ports[*]} " == *" $p "* ]] && continue
      (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
      ports+=("$p")
    done
    echo "${ports[*]}"
  fi
}

# ------------------------------------------------------------ certificates

gen_certs() {
  local d=$DIR/pki
  mkdir -p "$d"
  (
    cd "$d"
    exec 2>openssl.log
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=ebb-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out ca.crt
    leaf() { # NAME SUBJECT EXTFILE-CONTENT
      openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
        -extfile "$1.ext" -out "$1.crt"
      rm -f "$1.csr" "$1.ext"
    }
    leaf apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,IP:$REAL_NODE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    leaf admin "/O=system:masters/CN=kubernetes-admin" "$client"
    leaf kube-controller-manager "/CN=system:kube-controller-manager" "$client"
    leaf kube-scheduler "/CN=system:kube-scheduler" "$client"
    leaf kwok "/O=system:masters/CN=kwok-controller" "$client"
    leaf front-proxy-client "/CN=front-proxy-client" "$client"
    # service-account token signing key
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
  ) || { cat "$d/openssl.log" >&2; die "certificate generation with openssl failed (is openssl installed?)"; }
}

b64() { base64 <"$1" | tr -d '\n'; }

write_kubeconfig() { # FILE CERT-NAME USER
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ebb-e2e
  cluster:
    server: https://$APISERVER_HOST:$APISERVER_PORT
    certificate-authority-data: $(b64 "$DIR/pki/ca.crt")
users:
- name: $3
  user:
    client-certificate-data: $(b64 "$DIR/pki/$2.crt")
    client-key-data: $(b64 "$DIR/pki/$2.key")
contexts:
- name: ebb-e2e
  context:
    cluster: ebb-e2e
    user: $3
current-context: ebb-e2e
EOF
  chmod 600 "$1"
}

write_audit_policy() {
  local readers="" skipped="" list="" x
  if [[ -n ${EBB_K8S_AUDIT_READS_OF:-} ]]; then
    for x in ${EBB_K8S_AUDIT_READS_OF//,/ }; do list+="${list:+, }'$x'"; done
    readers="- level: Metadata
  users: [$list]
  verbs: ['get', 'list', 'watch']"
  fi
  list=""
  if [[ -n ${EBB_K8S_AUDIT_SKIP_NAMESPACES:-} ]]; then
    for x in ${EBB_K8S_AUDIT_SKIP_NAMESPACES//,/ }; do list+="${list:+, }'$x'"; done
    skipped="- level: None
  namespaces: [$list]"
  fi
  # Every write, at Metadata level (evictions and node writes with their bodies; pod and
  # PodDisruptionBudget writes with their responses too, so a test can replay each budget's
  # disruptionsAllowed and each pod's labels and readiness), except the node heartbeats' Lease
  # renewals; reads are not logged (but those of EBB_K8S_AUDIT_READS_OF).
  cat >"$DIR/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  namespaces: ["kube-node-lease"]
${readers}
${skipped}
- level: Request
  verbs: ["create"]
  resources: [{group: "", resources: ["pods/eviction"]}]
- level: Request
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources: [{group: "", resources: ["nodes"]}]
- level: RequestResponse
  verbs: ["create", "update", "patch"]
  resources: [{group: "policy", resources: ["poddisruptionbudgets", "poddisruptionbudgets/status"]}]
- level: RequestResponse
  verbs: ["create", "update", "patch"]
  resources: [{group: "", resources: ["pods", "pods/status"]}]
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
EOF
}

# ---------------------------------------------------------------- kwok

write_kwok_config() { # OUT PROFILE_ADDR
  local out=$1 profile=$2 f d
  [[ -f $STAGE_DIR/.stamp ]] || die "KWOK stages missing in $STAGE_DIR; run $HERE/build.sh"
  {
    # KWOK's node stages (initialize, heartbeat) and general pod stages,
    # except pod-delete which is replaced below.
    for d in node/fast node/heartbeat-with-lease pod/general; do
      for f in "$STAGE_DIR/$d"/*.yaml; do
        [[ $d == pod/general && ${f##*/} == pod-delete.yaml ]] && continue
        echo "---"
        echo "# from sigs.k8s.io/kwok kustomize/stage/$d/${f##*/}"
        if [[ $d == pod/* ]]; then
          # pod phase changes: 1 s + up to 5 s jitter upstream; quicker here
          sed -e "s/durationMilliseconds: 1000\$/durationMilliseconds: $POD_DELAY_MS/" \
            -e "s/jitterDurationMilliseconds: 5000\$/jitterDurationMilliseconds: $POD_JITTER_MS/" "$f"
        elif [[ ${f##*/} == node-heartbeat-with-lease.yaml ]]; then
          # upstream reports every node's status 600-610 s after the last: a cluster made
          # at once then patches all its nodes within 10 s every 10 minutes (5,000 at
          # 500/s stalled the scale bench's control plane). Kubelets' reports are spread:
          # 600-1200 s here.
          grep -q 'jitterDurationMilliseconds: 610000$' "$f" ||
            die "kwok's $f changed: its heartbeat jitter is no longer 610000 ms"
          sed -e "s/jitterDurationMilliseconds: 610000\$/jitterDurationMilliseconds: 1200000/" "$f"
        else
          cat "$f"
        fi
      done
    done
    # KWOK's general pod-delete waits a random time between 1 s and the
    # deletionTimestamp; this one removes a terminating pod 1 s after its
    # deletionTimestamp (deletion time + termination grace period, rounded
    # down to the second), like a kubelet whose containers use their whole
    # grace period: never before the grace period is over.
    cat <<'EOF'
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  weight: 1
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.deletionTimestamp | fromdateiso8601 + 1 | todateiso8601'
  next:
    delete: true
EOF
    # A pod annotated ebb.dev/e2e-never-ready starts (Running, its containers started) but
    # never becomes Ready, like a container whose readiness probe keeps failing. It also
    # carries pod-ready.stage.kwok.x-k8s.io/weight=0, so that KWOK's pod-ready never wins.
    cat <<STAGE
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-running-unready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchAnnotations:
      ebb.dev/e2e-never-ready: "true"
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.conditions.[] | select( .type == "Initialized" ) | .status'
      operator: 'In'
      values:
      - 'True'
    - key: '.status.containerStatuses.[].state.running.startedAt'
      operator: 'DoesNotExist'
  weight: 100000
  delay:
    durationMilliseconds: $POD_DELAY_MS
    jitterDurationMilliseconds: $POD_JITTER_MS
  next:
    patches:
    - subresource: status
      root: status
      type: strategic
      template: |
        {{ \$now := Now }}
        conditions:
        - lastProbeTime: null
          lastTransitionTime: {{ \$now | Quote }}
          message: 'the readiness probe fails'
          reason: ContainersNotReady
          status: "False"
          type: Ready
        - lastProbeTime: null
          lastTransitionTime: {{ \$now | Quote }}
          message: 'the readiness probe fails'
          reason: ContainersNotReady
          status: "False"
          type: ContainersReady
        containerStatuses:
        {{ range .spec.containers }}
        - image: {{ .image | Quote }}
          name: {{ .name | Quote }}
          ready: false
          restartCount: 0
          started: true
          state:
            running:
              startedAt: {{ \$now | Quote }}
        {{ end }}
        phase: Running
STAGE
    # kwok plays stages with 4 workers each for pods and nodes by default: a bench that makes
    # thousands of pods Running at once raises it.
    local nodes_par=${EBB_K8S_KWOK_PARALLELISM:-} pods_par=${EBB_K8S_KWOK_POD_PARALLELISM:-}
    if [[ -n $nodes_par || -n $pods_par || -n $profile ]]; then
      [[ -z $nodes_par || $nodes_par =~ ^[1-9][0-9]*$ ]] || die "EBB_K8S_KWOK_PARALLELISM must be a positive number"
      [[ -z $pods_par || $pods_par =~ ^[1-9][0-9]*$ ]] || die "EBB_K8S_KWOK_POD_PARALLELISM must be a positive number"
      [[ -z $profile || $profile =~ ^127\.0\.0\.1:[0-9]+$ ]] || die "EBB_K8S_KWOK_PROFILE_ADDR must be 127.0.0.1:PORT"
      cat <<CONF
---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: ${pods_par:-4}
  nodePlayStageParallelism: ${nodes_par:-4}
  nodeLeaseParallelism: ${nodes_par:-4}
CONF
      # kwok's /debug/pprof, to see where a busy kwok's CPU goes (go tool pprof).
      [[ -z $profile ]] || cat <<CONF
  serverAddress: "$profile"
  enableDebuggingHandlers: true
  enableProfilingHandler: true
CONF
    fi
  } >"$out"
}

node_yaml() { # NAME
  local shard=
  (($(kwok_shards) > 1)) && shard="$KWOK_SHARD_LABEL: \"$(shard_of "$1")\""
  cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    $shard
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
spec:
  providerID: kwok://$1
status:
  capacity: {cpu: "4", memory: 16Gi, pods: "110"}
  allocatable: {cpu: "4", memory: 16Gi, pods: "110"}
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
EOF
}

nodes_ready() { # NAME...: all Ready
  local out n
  out=$(kubectl_ get nodes -o 'jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}') || return 1
  for n in "$@"; do
    grep -qxF "$n=True" <<<"$out" || return 1
  done
}

add_nodes() { # NAME...
  (($#)) || return 0
  local n
  for n in "$@"; do node_yaml "$n"; done | kubectl_ apply -f - >/dev/null ||
    fail "" "creating nodes failed"
  wait_for "nodes $* to be Ready" nodes_ready "$@"
}

# ---------------------------------------------------------------- commands

need_bins() {
  local b
  for b in "${COMPONENTS[@]}" kubectl; do
    [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b not found; build the control plane first: $HERE/build.sh"
  done
  command -v openssl >/dev/null 2>&1 || die "openssl is required (to generate certificates)"
}

set_dir() {
  [[ -n ${1:-} ]] || die "missing DIR argument"
  mkdir -p "$1"
  DIR=$(cd "$1" && pwd)
}

cmd_up() {
  set_dir "${1:-}"
  shift
  local nodes=0 real=0
  while (($#)); do
    case $1 in
    --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    --real-node) real=1; shift ;;
    *) die "unknown option '$1'" ;;
    esac
  done
  [[ $nodes =~ ^[0-9]+$ ]] || die "--nodes must be a number"
  need_bins
  ((real)) && real_need
  local name
  for name in "${COMPONENTS[@]}"; do
    pid_alive "$name" && die "$name is already running for $DIR (run: $0 down $DIR)"
  done
  boot_lock
  local t0
  t0=$(now_ms)
  rm -rf "$DIR/etcd-data" "$DIR/pids" "$DIR/pki"
  mkdir -p "$DIR/pids"
  for name in "${COMPONENTS[@]}"; do : >"$DIR/$name.log"; done
  STOP_ON_FAIL=1
  trap 'fail "" "interrupted"' INT TERM
  # With a real node, pods reach the API server at the node's address (through the
  # `kubernetes` Service), so it listens there and advertises it.
  local apiserver_net=(--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none)
  if ((real)); then
    real_network_up
    APISERVER_HOST=$REAL_NODE_IP
    apiserver_net=(--bind-address="$REAL_NODE_IP" --advertise-address="$REAL_NODE_IP"
      --kubelet-client-certificate="$DIR/pki/apiserver-kubelet-client.crt"
      --kubelet-client-key="$DIR/pki/apiserver-kubelet-client.key"
      --kubelet-preferred-address-types=InternalIP)
  fi

  if [[ -n ${EBB_K8S_ETCD_RESTORE:-} ]]; then
    [[ -f $EBB_K8S_ETCD_RESTORE/member/snap/db ]] ||
      die "EBB_K8S_ETCD_RESTORE=$EBB_K8S_ETCD_RESTORE is not an etcd data directory (cluster.sh save-etcd writes one)"
    local t_copy
    t_copy=$(now_ms)
    cp -a "$EBB_K8S_ETCD_RESTORE" "$DIR/etcd-data"
    log "etcd data restored from $EBB_K8S_ETCD_RESTORE in $((($(now_ms) - t_copy) / 1000))s"
  fi
  read -r ETCD_PORT ETCD_PEER_PORT APISERVER_PORT KCM_PORT SCHEDULER_PORT <<<"$(free_ports 5)"
  gen_certs
  ((real)) && real_node_certs
  write_kubeconfig "$DIR/kubeconfig" admin kubernetes-admin
  write_kubeconfig "$DIR/kube-controller-manager.kubeconfig" kube-controller-manager system:kube-controller-manager
  write_kubeconfig "$DIR/kube-scheduler.kubeconfig" kube-scheduler system:kube-scheduler
  write_kubeconfig "$DIR/kwok.kubeconfig" kwok kwok-controller
  write_audit_policy
  local shards k profile=${EBB_K8S_KWOK_PROFILE_ADDR:-}
  shards=$(kwok_shards)
  [[ -z $profile || $profile =~ ^127\.0\.0\.1:[0-9]+$ ]] || die "EBB_K8S_KWOK_PROFILE_ADDR must be 127.0.0.1:PORT"
  write_kwok_config "$DIR/kwok.yaml" "$profile"
  for ((k = 1; k < shards; k++)); do
    write_kwok_config "$DIR/kwok-$k.yaml" "${profile:+127.0.0.1:$((${profile##*:} + k))}"
  done
  : >"$DIR/audit.log"

  # shellcheck disable=SC2086
  local etcd_url=http://127.0.0.1:$ETCD_PORT peer_url=http://127.0.0.1:$ETCD_PEER_PORT
  start etcd --name=ebb-e2e --data-dir="$DIR/etcd-data" \
    --listen-client-urls="$etcd_url" --advertise-client-urls="$etcd_url" \
    --listen-peer-urls="$peer_url" --initial-advertise-peer-urls="$peer_url" \
    --initial-cluster="ebb-e2e=$peer_url" --initial-cluster-state=new \
    --unsafe-no-fsync=true --snapshot-count=100000 --log-level=warn \
    ${EBB_K8S_ETCD_ARGS:-}

  local pki=$DIR/pki
  # shellcheck disable=SC2086
  start kube-apiserver --etcd-servers="$etcd_url" \
    "${apiserver_net[@]}" --secure-port="$APISERVER_PORT" \
    --cert-dir="$DIR/apiserver-certs" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --requestheader-client-ca-file="$pki/ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --allow-privileged=true \
    --audit-policy-file="$DIR/audit-policy.yaml" --audit-log-path="$DIR/audit.log" \
    --audit-log-format=json --audit-log-mode=blocking --audit-log-maxbackup=0 --audit-log-maxsize=0 \
    --profiling=false \
    ${EBB_K8S_APISERVER_ARGS:-}

  wait_for "kube-apiserver /readyz" kubectl_ get --raw /readyz
  local t_api
  t_api=$(now_ms)

  # shellcheck disable=SC2086
  start kube-controller-manager --kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
    --leader-elect=false \
    --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --node-monitor-period=5s --node-monitor-grace-period=40s \
    --kube-api-qps=100 --kube-api-burst=200 \
    --profiling=false \
    ${EBB_K8S_CONTROLLER_MANAGER_ARGS:-}

  # shellcheck disable=SC2086
  start kube-scheduler --kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" \
    --leader-elect=false --profiling=false \
    ${EBB_K8S_SCHEDULER_ARGS:-}

  # kwok fakes only the nodes annotated kwok.x-k8s.io/node=fake (all but a real node)
  local kwok_nodes=(--manage-all-nodes=true)
  ((real)) && kwok_nodes=(--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake)
  for ((k = 0; k < shards; k++)); do
    local name=kwok config=$DIR/kwok.yaml
    ((k)) && name=kwok-$k config=$DIR/kwok-$k.yaml
    if ((shards > 1)); then
      kwok_nodes=(--manage-nodes-with-label-selector="$KWOK_SHARD_LABEL=$k")
      ((real)) && kwok_nodes+=(--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake)
    fi
    # shellcheck disable=SC2086
    start "$name" --kubeconfig="$DIR/kwok.kubeconfig" --config="$config" \
      "${kwok_nodes[@]}" --node-lease-duration-seconds=40 \
      --disregard-status-with-annotation-selector=ebb.dev/e2e-unmanaged=true \
      --disregard-status-with-label-selector=ebb.dev/e2e-unmanaged=true \
      ${EBB_K8S_KWOK_ARGS:-}
  done

  local names=() i
  for ((i = 0; i < nodes; i++)); do names+=("kwok-node-$i"); done
  add_nodes "${names[@]}"
  wait_for "the default ServiceAccount (kube-controller-manager)" kubectl_ get serviceaccount default -n default
  ((real)) && real_node_up
  check_started

  cat >"$DIR/env" <<EOF
export KUBECONFIG=$(printf %q "$DIR/kubeconfig")
export EBB_K8S_DIR=$(printf %q "$DIR")
export EBB_K8S_BIN_DIR=$(printf %q "$BIN_DIR")
export EBB_K8S_KUBECTL=$(printf %q "$BIN_DIR/kubectl")
export EBB_K8S_APISERVER_URL=https://$APISERVER_HOST:$APISERVER_PORT
export EBB_K8S_APISERVER_PORT=$APISERVER_PORT
export EBB_K8S_ETCD_PORT=$ETCD_PORT
export EBB_K8S_CONTROLLER_MANAGER_PORT=$KCM_PORT
export EBB_K8S_SCHEDULER_PORT=$SCHEDULER_PORT
export EBB_K8S_AUDIT_LOG=$(printf %q "$DIR/audit.log")
EOF
  if ((real)); then
    cat >>"$DIR/env" <<EOF
export EBB_K8S_REAL_NODE=$REAL_NODE_NAME
export EBB_K8S_REAL_NODE_LABEL=$REAL_NODE_LABEL
export EBB_K8S_PAUSE_IMAGE=$PAUSE_IMAGE
export EBB_K8S_CONTAINERD_ADDRESS=$(printf %q "$DIR/containerd/containerd.sock")
EOF
  fi
  trap - INT TERM
  local t1
  t1=$(now_ms)
  log "up in $(((t1 - t0) / 1000)).$(printf %03d $(((t1 - t0) % 1000)))s (apiserver ready after $(((t_api - t0) / 1000)).$(printf %03d $(((t_api - t0) % 1000)))s), $nodes node(s)$( ((real)) && echo " and the real node $REAL_NODE_NAME"), https://$APISERVER_HOST:$APISERVER_PORT"
  log "export KUBECONFIG=$DIR/kubeconfig   (or: source $DIR/env)"
}

cmd_add_node() {
  set_dir "${1:-}"
  shift
  need_bins
  pid_alive kube-apiserver || die "kube-apiserver is not running for $DIR"
  add_nodes "$@"
}

cmd_restart_apiserver() {
  set_dir "${1:-}"
  shift
  local down=0 sig=KILL
  while (($#)); do
    case $1 in
    --down-secs) down=${2:?--down-secs needs a number}; shift 2 ;;
    --down-secs=*) down=${1#*=}; shift ;;
    --graceful) sig=TERM; shift ;;
    *) die "unknown option '$1'" ;;
    esac
  done
  [[ -f $DIR/pids/kube-apiserver.cmd ]] || die "no kube-apiserver recorded in $DIR (run: $0 up $DIR)"
  local t0
  t0=$(now_ms)
  stop kube-apiserver "$sig"
  log "kube-apiserver stopped (SIG$sig); starting it again in ${down}s"
  sleep "$down"
  restart_recorded kube-apiserver
  wait_for "kube-apiserver /readyz" kubectl_ get --raw /readyz
  local t1
  t1=$(now_ms)
  log "kube-apiserver restarted, ready again $(((t1 - t0) / 1000)).$(printf %03d $(((t1 - t0) % 1000)))s after the stop"
}

cmd_stop_etcd() {
  set_dir "${1:-}"
  shift
  local down=10
  while (($#)); do
    case $1 in
    --down-secs) down=${2:?--down-secs needs a number}; shift 2 ;;
    --down-secs=*) down=${1#*=}; shift ;;
    *) die "unknown option '$1'" ;;
    esac
  done
  [[ -f $DIR/pids/etcd.cmd ]] || die "no etcd recorded in $DIR (run: $0 up $DIR)"
  local t0
  t0=$(now_ms)
  stop etcd KILL
  log "etcd stopped (SIGKILL); starting it again in ${down}s"
  sleep "$down"
  restart_recorded etcd
  wait_for "kube-apiserver /readyz" kubectl_ get --raw /readyz
  local t1
  t1=$(now_ms)
  log "etcd restarted, kube-apiserver ready again $(((t1 - t0) / 1000)).$(printf %03d $(((t1 - t0) % 1000)))s after the stop"
}

cmd_save_etcd() {
  set_dir "${1:-}"
  local to=${2:?usage: $0 save-etcd DIR TO}
  [[ -f $DIR/pids/etcd.cmd ]] || die "no etcd recorded in $DIR (run: $0 up $DIR)"
  local t0
  t0=$(now_ms)
  stop etcd TERM
  rm -rf "$to.tmp"
  mkdir -p "$(dirname "$to")"
  cp -a "$DIR/etcd-data" "$to.tmp" || { restart_recorded etcd; die "cannot copy etcd's data to $to.tmp"; }
  rm -rf "$to"
  mv "$to.tmp" "$to"
  restart_recorded etcd
  wait_for "kube-apiserver /readyz" kubectl_ get --raw /readyz
  log "etcd's data saved to $to ($(du -sh "$to" | cut -f1)); kube-apiserver ready again $((($(now_ms) - t0) / 1000))s after the stop"
}

cmd_stop_controllers() {
  set_dir "${1:-}"
  [[ -f $DIR/pids/kube-controller-manager.cmd ]] ||
    die "no kube-controller-manager recorded in $DIR (run: $0 up $DIR)"
  stop kube-controller-manager TERM
  log "kube-controller-manager stopped"
}

cmd_stop_kwok() {
  set_dir "${1:-}"
  [[ -f $DIR/pids/kwok.cmd ]] || die "no kwok recorded in $DIR (run: $0 up $DIR)"
  local name
  for name in $(kwok_extra_shards) kwok; do stop "$name" TERM; done
  log "kwok stopped"
}

cmd_start_controllers() {
  set_dir "${1:-}"
  [[ -f $DIR/pids/kube-controller-manager.cmd ]] ||
    die "no kube-controller-manager recorded in $DIR (run: $0 up $DIR)"
  pid_alive kube-controller-manager && die "kube-controller-manager already runs in $DIR"
  restart_recorded kube-controller-manager
  log "kube-controller-manager started again"
}

cmd_import_images() {
  set_dir "${1:-}"
  shift
  [[ -S $DIR/containerd/containerd.sock ]] && pid_alive containerd ||
    die "no real node runs for $DIR (cluster.sh up $DIR --real-node)"
  real_import "$@"
}

cmd_down() {
  set_dir "${1:-}"
  [[ -d $DIR/pids ]] || { log "nothing recorded in $DIR"; return 0; }
  stop_all
  log "stopped; logs kept in $DIR"
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
  up) cmd_up "$@" ;;
  add-node) cmd_add_node "$@" ;;
  import-images) cmd_import_images "$@" ;;
  restart-apiserver) cmd_restart_apiserver "$@" ;;
  stop-etcd) cmd_stop_etcd "$@" ;;
  save-etcd) cmd_save_etcd "$@" ;;
  stop-controllers) cmd_stop_controllers "$@" ;;
  stop-kwok) cmd_stop_kwok "$@" ;;
  start-controllers) cmd_start_controllers "$@" ;;
  down) cmd_down "$@" ;;
  -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "usage: $0 up|add-node|restart-apiserver|stop-etcd|save-etcd|stop-controllers|stop-kwok|start-controllers|down DIR ... (try --help)" ;;
  esac
}

main "$@"
