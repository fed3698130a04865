#!/usr/bin/env bash
# Create (or refresh) the virtual environments of the peer systems that the benchmarks compare
# against, under benchmarks/.peers/:
#
#   dynet  DyNet with automatic batching: PyPI "dynet38" 2.2 (a cp311 manylinux wheel of DyNet
#          2.x; CPU only, single-threaded). Runs benchmarks/peers/dynet_treelstm.py.
#   dgl    DGL 1.1.3 on PyTorch (CPU). DGL 2.1.0, the newest DGL on PyPI for this platform,
#          cannot be imported with torch 2.13: its bundled graphbolt library exists only for
#          torch 2.0.0-2.2.1 ("Cannot find DGL C++ graphbolt library ...
#          libgraphbolt_pytorch_2.13.0.so"). DGL 1.1.3 has no graphbolt and works with
#          torch 2.13 (its optional tensoradapter library is not built for 2.13, so DGL uses its
#          own CPU allocator). DGL is installed with --no-deps so that pip keeps the torch
#          chosen here. Runs benchmarks/peers/dgl_treelstm.py.
#          The same environment holds DGL-LifeSci ("dgllife" 0.3.2, the newest release; it
#          supports DGL 1.x), also --no-deps, with the packages its import needs: pandas,
#          scikit-learn and rdkit (its other requirements, hyperopt among them, serve only
#          its example scripts). Runs benchmarks/peers/dgllife_weave.py.
#   pyg    PyTorch Geometric ("torch_geometric" 2.8.1, pure Python) on PyTorch (CPU), without
#          the optional torch_scatter / torch_sparse extensions. Installed with --no-deps so
#          that pip keeps the torch chosen here, with the packages its import needs: numpy,
#          xxhash, tqdm, psutil and requests (fsspec and jinja2 come with torch; its other
#          requirements, aiohttp and pyparsing, are not imported by what the benchmark uses).
#          Runs benchmarks/peers/pyg_weave.py.
#
# Prints one line per peer, "NAME: ok (VERSION)" or "NAME: unavailable: REASON" (the dgl
# step prints one for dgl and one for dgllife), and always exits 0. Installation logs go to
# benchmarks/.peers/NAME-setup.log.
#
# Environment: PYTHON (default python3), TORCH_VERSION (default 2.13.0), PEERS (default
# "dynet dgl pyg").
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/.peers"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PEERS="${PEERS:-dynet dgl pyg}"
DYNET_SPEC="dynet38==2.2"
DGL_VERSION="1.1.3"
DGLLIFE_VERSION="0.3.2"
PYG_VERSION="2.8.1"
mkdir -p "$root"

# make_venv NAME: create benchmarks/.peers/NAME unless it already has a working python.
make_venv() {
    local venv="$root/$1"
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "" 2>/dev/null; then
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv" || return 1
    fi
}

# last_error LOG: the most telling line of a failed step.
last_error() {
    local line
    line="$(grep -E 'Error|ERROR|error:' "$1" | grep -v '^WARNING' | tail -n 1)"
    [ -n "$line" ] || line="$(grep -v '^WARNING' "$1" | tail -n 1)"
    echo "${line:-unknown error (see $1)}"
}

# ensure NAME LOG VENV DIST VERSION [PIP-OPTION...]: pip-install DIST==VERSION into VENV unless
# that version is there; on failure, print NAME's "unavailable" line and return 1.
ensure() {
    local name="$1" log="$2" venv="$3" dist="$4" version="$5"
    shift 5
    local have
    have="$("$venv/bin/python" -c "from importlib.metadata import version; print(version('$dist').split('+')[0])" 2>/dev/null)"
    [ "$have" = "$version" ] && return 0
    if ! "$venv/bin/pip" install --disable-pip-version-check "$@" "$dist==$version" >>"$log" 2>&1; then
        echo "$name: unavailable: pip install $dist==$version failed: $(last_error "$log")"
        return 1
    fi
}

setup_dynet() {
    local log="$root/dynet-setup.log" venv="$root/dynet"
    : >"$log"
    if ! make_venv dynet >>"$log" 2>&1; then
        echo "dynet: unavailable: cannot create venv: $(last_error "$log")"
        return
    fi
    if ! "$venv/bin/python" -c "import dynet" >>"$log" 2>&1; then
        if ! "$venv/bin/pip" install --disable-pip-version-check "$DYNET_SPEC" >>"$log" 2>&1; then
            echo "dynet: unavailable: pip install $DYNET_SPEC failed: $(last_error "$log")"
            return
        fi
    fi
    # A tiny forward/backward with autobatching on, as the benchmark uses it.
    local version
    if ! version="$("$venv/bin/python" - 2>>"$log" <<'EOF'
import dynet_config
dynet_config.set(mem="64", autobatch=1)
import dynet as dy
from importlib.metadata import version
pc = dy.ParameterCollection()
w = pc.add_parameters((3, 4))
dy.renew_cg()
loss = dy.esum([dy.sum_elems(w * dy.inputVector([1.0, 2.0, 3.0, float(k)])) for k in range(3)])
loss.value()
loss.backward()
print(version("dyNET38"))
EOF
)"; then
        echo "dynet: unavailable: import or smoke test failed: $(last_error "$log")"
        return
    fi
    echo "dynet: ok (dynet38 $version)"
}

setup_dgl() {
    local log="$root/dgl-setup.log" venv="$root/dgl"
    : >"$log"
    if ! make_venv dgl >>"$log" 2>&1; then
        echo "dgl: unavailable: cannot create venv: $(last_error "$log")"
        return
    fi
    local py="$venv/bin/python" pip="$venv/bin/pip --disable-pip-version-check"
    ensure dgl "$log" "$venv" torch "$TORCH_VERSION" || return
    ensure dgl "$log" "$venv" dgl "$DGL_VERSION" --no-deps || return
    # DGL's own run-time dependencies (it was installed without them).
    if ! $pip install "numpy<2" scipy networkx psutil tqdm requests packaging >>"$log" 2>&1; then
        echo "dgl: unavailable: installing DGL's dependencies failed: $(last_error "$log")"
        return
    fi
    # A tiny batched tree through prop_nodes_topo, forward and backward.
    local version
    if ! version="$(DGLBACKEND=pytorch "$py" - 2>>"$log" <<'EOF'
import warnings
warnings.filterwarnings("ignore")
import dgl
import torch
g = dgl.batch([dgl.graph(([0, 1], [2, 2])), dgl.graph(([0, 1, 2, 3], [2, 2, 4, 4]))])
x = torch.ones(g.num_nodes(), 2, requires_grad=True)
g.ndata["h"] = x * 1.0
dgl.prop_nodes_topo(g, lambda e: {"m": e.src["h"]}, lambda n: {"h": n.mailbox["m"].sum(1)})
g.ndata["h"].sum().backward()
assert float(g.ndata["h"][-1, 0]) == 3.0, g.ndata["h"]
print(f"dgl {dgl.__version__}, torch {torch.__version__}")
EOF
)"; then
        echo "dgl: unavailable: import or smoke test failed: $(last_error "$log")"
        return
    fi
    echo "dgl: ok ($version)"
    dgl_ok=1
}

# DGL-LifeSci in the dgl environment (once setup_dgl has made DGL work).
setup_dgllife() {
    local log="$root/dgl-setup.log" py="$root/dgl/bin/python"
    local pip="$root/dgl/bin/pip --disable-pip-version-check"
    ensure dgllife "$log" "$root/dgl" dgllife "$DGLLIFE_VERSION" --no-deps || return
    # What `import dgllife` needs (its data and model modules import these at load time).
    if ! $pip install "numpy<2" pandas scikit-learn rdkit >>"$log" 2>&1; then
        echo "dgllife: unavailable: installing dgllife's dependencies failed: $(last_error "$log")"
        return
    fi
    # Two small molecule graphs batched through WeaveGNN, forward and backward.
    local version
    if ! version="$(DGLBACKEND=pytorch "$py" - 2>>"$log" <<'EOF'
import warnings
warnings.filterwarnings("ignore")
import dgl
import dgllife
import torch
from dgllife.model.gnn.weave import WeaveGNN
g = dgl.batch([dgl.graph(([0, 1], [1, 0])), dgl.graph(([0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1]))])
gnn = WeaveGNN(node_in_feats=3, edge_in_feats=2, num_layers=2, hidden_feats=4)
atoms = gnn(g, torch.randn(g.num_nodes(), 3), torch.randn(g.num_edges(), 2))
assert atoms.shape == (5, 4), atoms.shape
with g.local_scope():
    g.ndata["h"] = atoms
    total = dgl.readout_nodes(g, "h", op="sum")
assert total.shape == (2, 4), total.shape
total.sum().backward()
assert gnn.gnn_layers[0].update_edge.weight.grad is not None
print(f"dgllife {dgllife.__version__}")
EOF
)"; then
        echo "dgllife: unavailable: import or smoke test failed: $(last_error "$log")"
        return
    fi
    echo "dgllife: ok ($version)"
}

setup_pyg() {
    local log="$root/pyg-setup.log" venv="$root/pyg"
    : >"$log"
    if ! make_venv pyg >>"$log" 2>&1; then
        echo "pyg: unavailable: cannot create venv: $(last_error "$log")"
        return
    fi
    local py="$venv/bin/python" pip="$venv/bin/pip --disable-pip-version-check"
    ensure pyg "$log" "$venv" torch "$TORCH_VERSION" || return
    ensure pyg "$log" "$venv" torch_geometric "$PYG_VERSION" --no-deps || return
    # What `import torch_geometric` needs (it was installed without its dependencies).
    if ! $pip install numpy xxhash tqdm psutil requests >>"$log" 2>&1; then
        echo "pyg: unavailable: installing torch_geometric's dependencies failed: $(last_error "$log")"
        return
    fi
    # Two small graphs batched, a sum over the edges into each node and one per graph, forward
    # and backward.
    local version
    if ! version="$("$py" - 2>>"$log" <<'EOF'
import warnings
warnings.filterwarnings("ignore")
import torch
import torch_geometric
from torch_geometric.data import Batch, Data
from torch_geometric.nn import global_add_pool
from torch_geometric.utils import scatter
x = torch.ones(5, 2, requires_grad=True)
edges = [torch.tensor([[1], [0]]), torch.tensor([[1, 2, 0], [0, 0, 1]])]
b = Batch.from_data_list([Data(x=x[:2], edge_index=edges[0]), Data(x=x[2:], edge_index=edges[1])])
h = scatter(b.x[b.edge_index[0]], b.edge_index[1], dim=0, dim_size=b.num_nodes, reduce="sum")
total = global_add_pool(h, b.batch, size=b.num_graphs)
total.sum().backward()
assert total[:, 0].tolist() == [1.0, 3.0], total
assert x.grad[:, 0].tolist() == [0.0, 1.0, 1.0, 1.0, 1.0], x.grad
print(f"torch_geometric {torch_geometric.__version__}, torch {torch.__version__}")
EOF
)"; then
        echo "pyg: unavailable: import or smoke test failed: $(last_error "$log")"
        return
    fi
    echo "pyg: ok ($version)"
}

for peer in $PEERS; do
    case "$peer" in
        dynet) setup_dynet ;;
        dgl)
            dgl_ok=0
            setup_dgl
            if [ "$dgl_ok" = 1 ]; then
                setup_dgllife
            else
                echo "dgllife: unavailable: it needs the dgl environment"
            fi
            ;;
        pyg) setup_pyg ;;
        *) echo "$peer: unavailable: unknown peer" ;;
    esac
done
exit 0
