"""The definition stage: immutable neurons, a key that cannot go stale, and the layering
of the pipeline (each stage imports only the stages below it)."""

from __future__ import annotations

import ast
import copy
import pickle
from pathlib import Path

import pytest
import sympy as sp
import torch

import symneuron as sn

PACKAGE = Path(sn.__file__).parent

#: The pipeline, bottom first: a module may import only modules of its own or a lower rank.
STAGES: dict[str, int] = {
    "symbols": 0,
    "assumptions": 0,
    "validate": 0,
    "state": 0,
    "dtypes": 0,
    "surrogate": 0,
    "memo": 0,
    "signature": 0,
    "params": 0,
    "rng": 0,
    "stochastic": 0,
    "definition": 1,
    "derivation": 2,
    "ode": 2,
    "layer_params": 2,
    "reference": 2,
    "codegen": 3,
    "inputs": 3,
    "neuron": 4,
    "runtime": 4,
    "binding": 5,
    "binding_recurrent": 5,
    "binding_loop": 5,
    "binding_events": 5,
    "models": 5,
    "simulate": 6,
    "eventprop": 6,
    "checkpointing": 7,
    "layer": 7,
    "recurrent": 8,
    "check": 8,
    "check_events": 8,
    "check_recurrent": 8,
    "testing": 8,
    "plot": 8,
    "datasets": 8,
    "nir": 8,
    "cli": 9,
    "__main__": 10,
}


def _stage(module: str) -> str:
    """``symneuron.codegen.steps`` -> ``codegen``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    """Absolute names of the symneuron modules ``path`` imports (anywhere in the file)."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.startswith("symneuron"):
                if node.module is None or target == "symneuron":
                    out |= {f"{target}.{alias.name}" for alias in node.names}
                else:
                    out.add(target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("symneuron")}
    return out


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_each_stage_imports_only_lower_stages(path: Path) -> None:
    own = _stage(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
    assert own in STAGES, f"{path.name}: place the new module in STAGES"
    for target in _imports(path):
        other = _stage(target)
        assert STAGES[other] <= STAGES[own], f"{own} (rank {STAGES[own]}) imports {target}"


def test_neuron_is_immutable_and_replace_gives_a_new_key() -> None:
    lif = sn.models.LIF()
    with pytest.raises(AttributeError, match=r"immutable.*replace\(v_reset=...\)"):
        lif.v_reset = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        lif.params["tau"] = 3.0  # type: ignore[index]
    soft = lif.replace(v_reset=None)
    assert isinstance(soft, sn.Neuron) and soft.v_reset is None and lif.v_reset == 0.0
    assert soft.key() != lif.key()
    assert lif.replace() == lif and lif.replace().key() == lif.key()
    with pytest.raises(TypeError, match="unknown arguments"):
        lif.replace(vreset=None)


def test_replaced_neuron_runs_its_own_kernels() -> None:
    """The stale-key bug: a changed reset must not be served the old kernel."""
    x = torch.full((6, 5), 0.9, dtype=torch.float64)
    hard = sn.models.IF()
    soft = hard.replace(v_reset=None)
    _, v_hard = sn.simulate(hard, x, backend="cpu")
    _, v_soft = sn.simulate(soft, x, backend="cpu")
    _, v_ref = sn.simulate(soft, x, backend="torch")
    torch.testing.assert_close(v_soft, v_ref)
    assert not torch.equal(v_hard, v_soft)


def test_pickle_and_copies_keep_the_definition() -> None:
    a = sp.Symbol("a")
    neuron = sn.Neuron(sn.V + a * sn.X, params={a: 0.5}, learnable=[a], name="Scaled")
    again = pickle.loads(pickle.dumps(neuron))
    assert type(again) is type(neuron) and again.key() == neuron.key() and again == neuron
    assert copy.deepcopy(neuron) is neuron and copy.copy(neuron) is neuron
    layer = sn.NeuronLayer(sn.models.PLIF())
    assert copy.deepcopy(layer).neuron is layer.neuron


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ([("tau", 3.0)], TypeError, "params must be a mapping"),
        ({1: 3.0}, TypeError, "keys must be sympy Symbols or names"),
        ({"taus": 3.0}, ValueError, r"Unknown parameter 'taus'; the neuron has \['tau'\]"),
    ],
)
def test_params_are_normalised_the_same_everywhere(bad: object, error: type, match: str) -> None:
    x = torch.rand(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(error, match=match):
        sn.simulate(sn.models.LIF(), x, params=bad, backend="torch")  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        sn.NeuronLayer(sn.models.LIF(), params=bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_compile_of_the_torch_backend_for_a_single_state_neuron() -> None:
    """Dynamo once mis-read ``not neuron.states`` on the read-only mapping."""
    neuron = sn.models.LIF()
    x = torch.rand(4, 16, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(lambda x: sn.simulate(neuron, x, backend="torch"))
    for a, b in zip(compiled(x), sn.simulate(neuron, x, backend="torch"), strict=True):
        torch.testing.assert_close(a, b)


# -- the reserved symbols: one table -------------------------------------------------


def test_every_reserved_name_is_refused_as_a_parameter_or_state_name() -> None:
    from symneuron.symbols import RESERVED

    noises = {"noise", *(f"noise{i}" for i in range(1, 8))}
    assert set(RESERVED) == {"V", "X", "H", "S", "xi", *noises}
    for name in RESERVED:
        with pytest.raises(ValueError, match=rf"Parameter name '{name}' is reserved \({name} is"):
            sn.Neuron(sn.V + sn.X, params={name: 1.0})
        with pytest.raises(ValueError, match=rf"State name '{name}' is reserved"):
            sn.Neuron(sn.V + sn.X, states={name: sn.State()})


@pytest.mark.parametrize(
    ("part", "build"),
    [
        ("charge", lambda z: sn.Neuron(sn.V + sn.X + z)),
        ("update", lambda z: sn.Neuron(sn.V + sn.X, states={"W": sn.State(update=z)})),
        ("on_spike", lambda z: sn.Neuron(sn.V + sn.X, states={"W": sn.State(on_spike=z)})),
        ("threshold", lambda z: sn.Neuron(sn.V + sn.X, v_threshold=1 + z)),
        ("ode", lambda z: sn.Neuron.from_ode(-sn.V + sn.X + z, dt=0.5, method="euler")),
    ],
)
def test_each_part_takes_exactly_the_reserved_symbols_the_table_allows(part, build) -> None:
    """Read from the table: every allowed symbol is accepted, every other one refused."""
    from symneuron.symbols import RESERVED, allowed_in

    for name, row in RESERVED.items():
        if name in allowed_in(part):
            build(row.symbol)
        else:
            with pytest.raises(ValueError, match=rf"\['{name}'\]"):
                build(row.symbol)


def test_a_new_row_in_the_table_is_a_new_reserved_symbol(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for a noise symbol: one row makes it reserved and usable where it says."""
    from symneuron import definition, symbols

    xi = sp.Symbol("xi", real=True)
    row = symbols.Reserved(xi, "a standard normal draw", frozenset({"update"}))
    monkeypatch.setitem(symbols.RESERVED, "xi", row)
    with pytest.raises(ValueError, match="'xi' is reserved"):
        definition.Definition(sn.V + sn.X, params={"xi": 1.0})
    neuron = definition.Definition(sn.V + sn.X, states={"W": sn.State(update=0.5 * xi)})
    assert neuron.states["W"].update.has(xi)
    with pytest.raises(ValueError, match=r"unknown symbols \['xi'\]"):
        definition.Definition(sn.V + sn.X + xi)


#: named-tuple methods and a tensor's version counter (public API despite the underscore)
_NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_version"}


def _third_party(tree: ast.Module) -> set[str]:
    """The names a module binds by importing other packages (torch, sympy, ...)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if not (node.module or "").startswith("symneuron"):
                found |= {a.asname or a.name for a in node.names}
    return found - {"symneuron"}


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _private_uses(path: Path) -> list[str]:
    """Underscored names of another module, or of another object than the class's own
    (``self``, ``cls`` or a class of the same module), that ``path`` imports or reads
    (other packages' privates aside)."""
    tree = ast.parse(path.read_text())
    third, found = _third_party(tree), []
    own_classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("symneuron")
        ):
            private = [a.name for a in node.names if a.name.startswith("_")]
            found += [f"{node.lineno}: imports {name}" for name in private]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if own or node.attr.startswith("__") or node.attr in _NAMEDTUPLE:
                continue
            if _root(node.value) in third | own_classes | {"super"}:
                continue
            found.append(f"{node.lineno}: reads {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_members() -> None:
    """Stages meet through public, typed interfaces: no ``other._name`` across modules."""
    found = {str(p.relative_to(PACKAGE)): _private_uses(p) for p in sorted(PACKAGE.rglob("*.py"))}
    assert not {k: v for k, v in found.items() if v}


def test_the_private_access_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "stray.py"
    module.write_text("from .layer import _helper\n\ndef f(cell):\n    return cell._start()\n")
    assert _private_uses(module) == ["1: imports _helper", "4: reads cell._start"]
