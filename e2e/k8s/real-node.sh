# Sourced by cluster.sh: a real node beside the KWOK nodes (`cluster.sh up DIR --real-node`):
# containerd (Debian's) with runc and a CNI bridge, a kubelet and kube-proxy from build.sh node.
#
# Network: a bridge REAL_BRIDGE holding REAL_NODE_IP, the node's address. kube-apiserver listens
# on that address (so pods reach it) and advertises it as the `kubernetes` Service's endpoint;
# kube-proxy (iptables mode) sends the Service's ClusterIP there, as in any cluster. Pods get
# addresses of POD_CIDR on the bridge and a route to the Service range through the node, and no
# default route. Nothing is forwarded off the machine: no masquerading, and the Service range is
# routed to the bridge, where only kube-proxy's rules give it a destination (so the API server
# reaches a webhook's Service as on a real control plane node). One real node per machine (the
# bridge and its range are fixed); `down` removes the bridge, kube-proxy's rules, the pods'
# network namespaces and every mount under DIR.
#
# This machine kind's needs: cgroup v1 (kubelet failCgroupV1: false, cgroupfs driver, containerd
# SystemdCgroup = false), restrict_oom_score_adj (root lacks CAP_SYS_RESOURCE), no swap.

REAL_NODE_NAME=${EBB_K8S_REAL_NODE_NAME:-ebb-real-node}
REAL_BRIDGE=ebb-e2e0
REAL_NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
# the label and taint of the real node: test workloads stay on KWOK nodes unless they tolerate it
REAL_NODE_LABEL=e2e.ebb.dev/real-node
REAL_OWNER_FILE=/run/ebb-e2e-real-node.dir
REAL_COMPONENTS=(containerd kubelet kube-proxy)
CNI_BIN_DIR=${EBB_K8S_CNI_BIN_DIR:-/usr/lib/cni}

real_need() {
  local b
  [[ $(id -u) == 0 ]] || die "--real-node needs root (containerd, kubelet, kube-proxy, network namespaces)"
  for b in containerd ctr runc iptables ip mount; do
    command -v "$b" >/dev/null 2>&1 ||
      die "--real-node needs $b (Debian: apt-get install containerd runc iptables iproute2 containernetworking-plugins)"
  done
  for b in bridge host-local loopback; do
    [[ -x $CNI_BIN_DIR/$b ]] || die "--real-node needs the CNI plugin $CNI_BIN_DIR/$b (Debian: apt-get install containernetworking-plugins)"
  done
  for b in kubelet kube-proxy; do
    [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b not found; build the node first: $HERE/build.sh node"
  done
  read -r PAUSE_IMAGE PAUSE_ARCHIVE <<<"$("$HERE/build.sh" --print-pause)"
  [[ -f $PAUSE_ARCHIVE ]] || die "the pause image $PAUSE_ARCHIVE is missing; build the node first: $HERE/build.sh node"
  if [[ -f $REAL_OWNER_FILE ]]; then
    local other
    other=$(<"$REAL_OWNER_FILE")
    if [[ $other != "$DIR" && -d $other/pids ]] && DIR=$other pid_alive kubelet; then
      die "a real node already runs on this machine, for $other (run: $0 down $other)"
    fi
    [[ $other != "$DIR" && -d $other ]] && (DIR=$other real_down) || true
  fi
  ip link show "$REAL_BRIDGE" >/dev/null 2>&1 && real_network_down
  echo "$DIR" >"$REAL_OWNER_FILE"
}

real_network_up() {
  ip link add "$REAL_BRIDGE" type bridge || fail "" "cannot create the bridge $REAL_BRIDGE"
  ip addr add "$REAL_NODE_IP/24" dev "$REAL_BRIDGE"
  ip link set "$REAL_BRIDGE" up
  # Service addresses are routed to the bridge, as on a control plane node that runs
  # kube-proxy: the route lets a host process's connection (the API server calling a webhook's
  # Service) pass the routing decision, and kube-proxy's DNAT (nat OUTPUT for the host,
  # PREROUTING for pods) then sends it to an endpoint. Without an endpoint, kube-proxy rejects.
  ip route replace "$SERVICE_CIDR" dev "$REAL_BRIDGE" src "$REAL_NODE_IP"
}

real_network_down() {
  ip route del "$SERVICE_CIDR" 2>/dev/null || true
  ip route del unreachable "$SERVICE_CIDR" 2>/dev/null || true
  ip link del "$REAL_BRIDGE" 2>/dev/null || true
}

write_containerd_config() {
  local d=$DIR/containerd
  mkdir -p "$d" "$DIR/cni/net.d"
  cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$d/containerd.sock"

[ttrpc]
  address = "$d/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj would be refused
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$DIR/cni/net.d"
  # Per-registry settings (hosts.toml), read at every pull: a test adds its registry here.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$d/certs.d"
EOF
  mkdir -p "$d/certs.d"
  cat >"$DIR/cni/net.d/10-ebb-e2e.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "ebb-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$REAL_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$REAL_NODE_IP"}]],
        "routes": [{"dst": "$SERVICE_CIDR", "gw": "$REAL_NODE_IP"}],
        "dataDir": "$DIR/cni/ipam"
      }
    }
  ]
}
EOF
}

ctr_() { ctr --address "$DIR/containerd/containerd.sock" --namespace k8s.io "$@"; }

# Imports OCI archives into containerd's k8s.io namespace (the kubelet's), keeping their names.
real_import() { # FILE...
  local f
  for f in "$@"; do
    [[ -f $f ]] || fail "" "no image archive $f"
    ctr_ images import --no-unpack=false "$f" >>"$DIR/containerd.log" 2>&1 ||
      fail containerd "importing $f into containerd failed"
  done
}

write_kubelet_config() {
  local pki=$DIR/pki
  mkdir -p "$DIR/kubelet" "$DIR/pod-logs"
  cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
# cgroup v1 on this machine kind (Kubernetes 1.35+ refuses it unless told)
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
address: $REAL_NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
podLogsDir: $DIR/pod-logs
maxPods: 30
registerWithTaints:
- {key: $REAL_NODE_LABEL, value: "true", effect: NoSchedule}
# no registry to pull from again: never collect the imported images
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%"}
localStorageCapacityIsolation: false
nodeStatusReportFrequency: 10s
EOF
}

write_kube_proxy_config() {
  cat >"$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: $REAL_NODE_NAME
clientConnection: {kubeconfig: $DIR/kube-proxy.kubeconfig}
bindAddress: $REAL_NODE_IP
healthzBindAddress: 127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$KUBE_PROXY_METRICS_PORT
clusterCIDR: $POD_CIDR
nodePortAddresses: ["$REAL_NODE_IP/32"]
iptables: {localhostNodePorts: false, masqueradeAll: false}
# leave the machine's conntrack settings as they are
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

real_node_certs() {
  (
    cd "$DIR/pki"
    exec 2>>openssl.log
    leaf() { # NAME SUBJECT EXT
      openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
        -extfile "$1.ext" -out "$1.crt"
      rm -f "$1.csr" "$1.ext"
    }
    local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    leaf kubelet "/O=system:nodes/CN=system:node:$REAL_NODE_NAME" "$client"
    leaf kube-proxy "/CN=system:kube-proxy" "$client"
    leaf apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    leaf kubelet-serving "/CN=$REAL_NODE_NAME" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$REAL_NODE_IP,DNS:$REAL_NODE_NAME"
  ) || { cat "$DIR/pki/openssl.log" >&2; die "certificate generation for the real node failed"; }
}

real_node_ready() {
  local out
  out=$(kubectl_ get node "$REAL_NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') || return 1
  [[ $out == True ]]
}

kube_proxy_synced() {
  curl -fsS "http://127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT/healthz" >/dev/null 2>&1 &&
    iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q -- "-d ${SERVICE_IP}/32 .*default/kubernetes:https"
}

# After the control plane is up: containerd, the pause image, the kubelet, kube-proxy.
real_node_up() {
  read -r KUBELET_PORT KUBELET_HEALTHZ_PORT KUBE_PROXY_HEALTHZ_PORT KUBE_PROXY_METRICS_PORT <<<"$(free_ports 4)"
  real_node_certs
  write_kubeconfig "$DIR/kubelet.kubeconfig" kubelet "system:node:$REAL_NODE_NAME"
  write_kubeconfig "$DIR/kube-proxy.kubeconfig" kube-proxy system:kube-proxy
  write_containerd_config
  write_kubelet_config
  write_kube_proxy_config

  start containerd --config "$DIR/containerd/config.toml" --log-level warn
  wait_for "containerd" ctr_ version
  real_import "$PAUSE_ARCHIVE"

  start kubelet --config="$DIR/kubelet.yaml" --kubeconfig="$DIR/kubelet.kubeconfig" \
    --root-dir="$DIR/kubelet" --hostname-override="$REAL_NODE_NAME" --node-ip="$REAL_NODE_IP" \
    --node-labels="$REAL_NODE_LABEL=true" --v=1 ${EBB_K8S_KUBELET_ARGS:-}
  wait_for "the real node $REAL_NODE_NAME to be Ready" real_node_ready

  start kube-proxy --config="$DIR/kube-proxy.yaml" --v=1 ${EBB_K8S_KUBE_PROXY_ARGS:-}
  wait_for "kube-proxy's rules for the kubernetes Service" kube_proxy_synced
}

# The chains the kubelet made (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) and any
# kube-proxy left: the jumps to them, then the chains. Only one real node runs on a machine.
real_iptables_cleanup() {
  local ipt t rule ch
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null 2>&1 || continue
    for t in filter nat mangle; do
      "$ipt" -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z-]+ .*-j KUBE-' | sed 's/^-A /-D /' |
        while read -r rule; do eval "\"\$ipt\" -t \"\$t\" $rule" 2>/dev/null || true; done || true
      for ch in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ { print $2 }'); do
        "$ipt" -t "$t" -F "$ch" 2>/dev/null || true
      done
      for ch in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ { print $2 }'); do
        "$ipt" -t "$t" -X "$ch" 2>/dev/null || true
      done
    done
  done
}

# Every mount under DIR (the kubelet's volumes, containers' root filesystems, network
# namespaces), deepest first.
real_unmount() {
  local m
  awk -v d="$DIR/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
}

real_down() {
  [[ -f $DIR/containerd/config.toml ]] || return 0
  stop kube-proxy
  stop kubelet
  if [[ -S $DIR/containerd/containerd.sock ]] && pid_alive containerd; then
    local id
    # every container, then every sandbox: killed and deleted (runc, the shims, the cgroups)
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop containerd
  [[ -x $BIN_DIR/kube-proxy ]] && "$BIN_DIR/kube-proxy" --cleanup >>"$DIR/kube-proxy.log" 2>&1 || true
  real_iptables_cleanup
  real_unmount
  real_network_down
  # the kubelet's links to container logs (a fixed path): those into DIR
  local l
  for l in /var/log/containers/*.log; do
    if [[ -L $l && "$(readlink "$l")" == "$DIR/"* ]]; then rm -f "$l"; fi
  done
  if [[ -f $REAL_OWNER_FILE && "$(<"$REAL_OWNER_FILE")" == "$DIR" ]]; then rm -f "$REAL_OWNER_FILE"; fi
}
