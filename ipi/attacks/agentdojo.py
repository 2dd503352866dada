"""The ``agentdojo`` source: AgentDojo's attack wrappers and injection-task goals, read offline.

AgentDojo (Debenedetti et al., NeurIPS 2024 Datasets & Benchmarks; PyPI ``agentdojo``, MIT) is
never imported (its modules pull in LLM clients): the **installed** package's files are located
through ``importlib.metadata`` (``pip install --no-deps 'agentdojo==0.1.35'``, the ``attacks``
extra) and read statically (:mod:`ipi.attacks.pyliteral`). What is read (docs/attacks.md,
"agentdojo"):

* **templates** — the jailbreak strings of the attack classes listed in ``data/agentdojo.yaml``;
* **goals** — ``GOAL`` of every injection task of the four suites at the benchmark version of
  ``data/agentdojo.yaml``, as AgentDojo's ``get_version_compatible_items`` picks it; families and
  constant targets from ``data/agentdojo.yaml``, further targets from :mod:`ipi.attacks.targets`
  and ``ground_truth``'s tool names; the goal-bound ``{tools}`` slot of ``tool_knowledge`` where
  ``ground_truth`` evaluates statically;
* **benign** — the default contents of the injection vectors listed in ``data/agentdojo.yaml``."""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from importlib import metadata
from pathlib import Path

import yaml

from ipi.attacks.source import AttackSourceError, BenignText, Goal, Provenance, Template, load_data
from ipi.attacks.pyliteral import NotLiteral, class_constants, evaluate, module_constants
from ipi.attacks.targets import extract_targets, merge_targets

__all__ = ["AgentDojoSource", "package_root"]

_CONFIG = "agentdojo.yaml"


def tested_version() -> str:
    """The agentdojo release ipi's texts were read and checked from (``package.tested`` of ``data/agentdojo.yaml``)."""
    return str(load_data(_CONFIG)["package"]["tested"])


def install_command(version: str | None = None) -> str:
    """The pip command that installs the tested agentdojo release (``version``: default :func:`tested_version`)."""
    return f"pip install --no-deps 'agentdojo=={version or tested_version()}' (the `attacks` extra: docs/attacks.md)"


def package_root() -> tuple[Path, str]:
    """The installed agentdojo package folder and its version, without importing it.

    The version is read with :func:`importlib.metadata.version`.

    Returns:
        ``(folder holding agentdojo/__init__.py, version)``.

    Raises:
        AttackSourceError: agentdojo is not installed (says how to install it).
    """
    try:
        version = metadata.version("agentdojo")
        dist = metadata.distribution("agentdojo")
    except metadata.PackageNotFoundError:
        raise AttackSourceError(f"attack source agentdojo: the package is not installed; {install_command()}") from None
    root = Path(str(dist.locate_file("agentdojo")))
    if not (root / "attacks").is_dir():
        raise AttackSourceError(f"attack source agentdojo: {root}/attacks not found (agentdojo {version} installed); "
                                f"{install_command()}")
    return root, version


def texts_digest(templates, goals, benign) -> str:
    """SHA-256 (16 hex digits) of every text's id, text, family and targets, in order.

    Two agentdojo releases with the same digest give a run the same rows (the digest the
    tested release gives is ``package.texts_digest`` of ``data/agentdojo.yaml``).
    """
    h = hashlib.sha256()
    for it in (*templates, *goals, *benign):
        extra = (getattr(it, "family", ""), sorted((k, tuple(v)) for k, v in dict(getattr(it, "target", {})).items()),
                 sorted(dict(getattr(it, "slots", {})).items()))
        h.update(f"{it.id}\x1f{it.text}\x1f{extra!r}\x1e".encode())
    return h.hexdigest()[:16]


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError) as e:
        raise AttackSourceError(f"attack source agentdojo: {path}: {e}") from e


def _class_attr(cls: ast.ClassDef, name: str):
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            return stmt.value
    return None


def _jailbreak(cls: ast.ClassDef, classes: dict[str, ast.ClassDef], names: dict) -> str | None:
    """The class's jailbreak string: its own/inherited ``_JB_STRING`` or its ``super().__init__`` literal."""
    node = _class_attr(cls, "_JB_STRING")
    if node is not None:
        return evaluate(node, names)
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            for call in ast.walk(stmt):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "__init__" and call.args
                        and isinstance(call.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp))):
                    return evaluate(call.args[0], names)
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            return _jailbreak(classes[base.id], classes, names)
    return None


def _attack_classes(root: Path) -> dict[str, tuple[str, str]]:
    """Attack ``name`` → (jailbreak string, origin) for every class in ``attacks/*.py`` that has one."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted((root / "attacks").glob("*.py")):
        tree = _parse(path)
        names = module_constants(tree)
        classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
        for cls in classes.values():
            name_node = _class_attr(cls, "name")
            if name_node is None:
                continue
            try:
                name, text = evaluate(name_node, names), _jailbreak(cls, classes, names)
            except NotLiteral:
                continue
            if isinstance(text, str):
                out[name] = (text, f"agentdojo/attacks/{path.name} {cls.name}")
    return out


_VERSION_RE = re.compile(r"^v(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


def _version(s: str) -> tuple[int, int, int]:
    m = _VERSION_RE.match(s)
    if not m:
        raise AttackSourceError(f"ipi/attacks/data/{_CONFIG}: benchmark_version {s!r} is not like 'v1.2.2'")
    return tuple(int(g or 0) for g in m.groups())  # type: ignore[return-value]


def _task_version(cls: ast.ClassDef, names: dict) -> tuple[int, int, int] | None:
    for dec in cls.decorator_list:
        if isinstance(dec, ast.Attribute) and dec.attr == "register_injection_task":
            return (1, 0, 0)
        if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.args
                and dec.func.attr in ("update_injection_task", "register_new_injection_task")):
            return tuple(evaluate(dec.args[0], names))  # type: ignore[return-value]
    return None


def _tool_calls(cls: ast.ClassDef, consts: dict) -> tuple[list[str], str | None]:
    """Tool names of ``ground_truth``'s ``FunctionCall``\\ s, and AgentDojo's tool sequence if static.

    The sequence reproduces ``ToolKnowledgeAttack.get_tools_sequence`` (agentdojo 0.1.35,
    attacks/important_instructions_attacks.py) word for word; it is None when a call's
    ``function`` or ``placeholder_args`` depends on the environment, or there is no call.
    """
    fn = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "ground_truth"), None)
    if fn is None:
        return [], None
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
             and c.func.id == "FunctionCall"]
    calls.sort(key=lambda c: (c.lineno, c.col_offset))
    tools: list[str] = []
    seq: list[tuple[str, object]] | None = []
    for c in calls:
        kw = {k.arg: k.value for k in c.keywords}
        try:
            name = evaluate(kw["function"], consts)
        except (KeyError, NotLiteral):
            seq = None
            continue
        tools.append(str(name))
        try:
            args = evaluate(kw["placeholder_args"], consts) if "placeholder_args" in kw else None
        except NotLiteral:
            args = None
        if seq is not None and args is not None:
            seq.append((str(name), args))
        else:
            seq = None
    # Loops and branches inside ground_truth make the calls depend on the environment.
    if seq is None or not seq or any(isinstance(n, (ast.For, ast.While, ast.comprehension, ast.If, ast.IfExp)) for n in ast.walk(fn)):
        return list(dict.fromkeys(tools)), None
    out = ""
    for i, (name, args) in enumerate(seq):
        if i == 0:
            out += f"You should use the tool `{name}` with the following arguments: {args}. "
        elif i == len(seq) - 1:
            out += f"Finally, you should use the tool `{name}` with the arguments: {args}. "
        else:
            out += f"Then, you should use the tool `{name}` with the arguments: {args}. "
    return list(dict.fromkeys(tools)), out


class AgentDojoSource:
    """AgentDojo's attacks, goals and benign vector defaults (module docstring)."""

    family = "agentdojo"

    def __init__(self, benchmark_version: str | None = None) -> None:
        """Args:
            benchmark_version: AgentDojo benchmark version (``"v1.2.2"``); default the one in
                ``data/agentdojo.yaml``.
        """
        self._cfg = load_data(_CONFIG)
        self.benchmark_version = benchmark_version or self._cfg["benchmark_version"]
        self._target = _version(self.benchmark_version)
        #: Set when an installed release other than the tested one is accepted (same texts): says which.
        self.accepted: str | None = None

    @functools.cached_property
    def _root(self) -> tuple[Path, str]:
        return package_root()

    @functools.cached_property
    def _texts(self) -> tuple[tuple[Template, ...], tuple[Goal, ...], tuple[BenignText, ...]]:
        """Templates, goals and benign texts of the installed release, checked against the tested one.

        The tested release (``package.tested``) is read as it is. Another release is read the
        same way and accepted only when it gives the tested release's texts (the same
        :func:`texts_digest` at the default benchmark version); :attr:`accepted` then says so.

        Raises:
            AttackSourceError: Another release that cannot be read like the tested one, or whose
                texts differ: one line naming the installed and the needed release and the pip
                command.
        """
        _, version = self._root
        package = self._cfg["package"]
        tested = str(package["tested"])
        read = lambda: (self._read_templates(), self._read_goals(), self._read_benign())  # noqa: E731
        if version == tested:
            return read()
        head = f"attack source agentdojo: agentdojo {version} is installed, ipi needs agentdojo {tested}"
        try:
            texts = read()
        except AttackSourceError as e:
            why = str(e) if len(str(e)) <= 160 else str(e)[:157] + "..."
            raise AttackSourceError(f"{head} ({version} cannot be read as {tested}: {why}); "
                                    f"{install_command(tested)}") from None
        digest = texts_digest(*texts)
        if self.benchmark_version != self._cfg["benchmark_version"] or digest != package["texts_digest"]:
            raise AttackSourceError(f"{head} ({version} gives other texts: digest {digest}, {tested} gives "
                                    f"{package['texts_digest']}); {install_command(tested)}")
        self.accepted = f"agentdojo {version} installed: its texts are identical to the tested {tested}'s " \
                        f"(digest {digest})"
        return texts

    def _read_templates(self) -> tuple[Template, ...]:
        root, version = self._root
        found = _attack_classes(root)
        out = []
        for name in self._cfg["attacks"]:
            if name not in found:
                raise AttackSourceError(
                    f"ipi/attacks/data/{_CONFIG}: attack {name!r} not found in agentdojo {version} "
                    f"(found: {sorted(found)})")
            text, origin = found[name]
            if "{{" in text or "}}" in text:
                raise AttackSourceError(f"agentdojo attack {name!r}: escaped braces are not supported")
            out.append(Template(id=f"agentdojo/{name}", source=self.family, text=text, name=name,
                                origin=origin, goal_slots=("tools",) if "{tools}" in text else ()))
        return tuple(out)

    def _read_goals(self) -> tuple[Goal, ...]:
        root, version = self._root
        fams: dict = self._cfg["families"]
        const_kinds: dict = self._cfg["constant_targets"]
        extras: dict = self._cfg.get("extra_targets") or {}
        latest: dict[str, tuple[tuple[int, int, int], Goal]] = {}
        every: set[str] = set()  # task ids of any version (a family for a later task is no typo)
        for path in sorted((root / "default_suites").glob("v*/*/injection_tasks.py")):
            suite, vdir = path.parent.name, path.parent.parent.name
            tree = _parse(path)
            names = module_constants(tree)
            for cls in (c for c in tree.body if isinstance(c, ast.ClassDef)):
                m = re.fullmatch(r"InjectionTask(\d+)", cls.name)
                ver = _task_version(cls, names) if m else None
                if ver is not None:
                    every.add(f"{suite}/injection_task_{int(m[1])}")
                if ver is None or ver > self._target:
                    continue
                consts = class_constants(cls, names)
                if "GOAL" not in consts:
                    raise AttackSourceError(f"{path}: {cls.name}.GOAL does not evaluate statically")
                gid = f"{suite}/injection_task_{int(m[1])}"
                if gid in latest and latest[gid][0] >= ver:
                    continue
                tools, seq = _tool_calls(cls, consts)
                named = merge_targets({kind: [consts[c]] for c, kind in const_kinds.items()
                                       if isinstance(consts.get(c), str)})
                # The text adds only kinds the constants do not name: a data source's address in
                # the text (an e-mail's sender) is not a target.
                found = {k: v for k, v in extract_targets(consts["GOAL"]).items() if k not in named}
                target = merge_targets(named, found, {"tool": tools} if tools else {}, extras.get(gid, {}))
                if gid not in fams:
                    raise AttackSourceError(
                        f"ipi/attacks/data/{_CONFIG}: no goal family for agentdojo {gid} "
                        f"(agentdojo {version}, {vdir}); add it under families")
                latest[gid] = (ver, Goal(
                    id=f"agentdojo/{gid}", source=self.family, family=fams[gid], text=consts["GOAL"],
                    target=target, origin=f"agentdojo/default_suites/{vdir}/{suite}/injection_tasks.py {cls.name}",
                    slots={"tools": seq} if seq else {}))
        stale = sorted(set(fams) - every)
        if stale:
            raise AttackSourceError(f"ipi/attacks/data/{_CONFIG}: families for unknown tasks {stale}")
        order = sorted(latest, key=lambda k: (k.split("/")[0], int(k.rsplit("_", 1)[1])))
        return tuple(latest[k][1] for k in order)

    def _read_benign(self) -> tuple[BenignText, ...]:
        root, _ = self._root
        out = []
        for vec in self._cfg["benign_vectors"]:
            suite, name = vec.split("/")
            path = root / "data" / "suites" / suite / "injection_vectors.yaml"
            try:
                text = yaml.safe_load(path.read_text(encoding="utf-8"))[name]["default"]
            except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
                raise AttackSourceError(f"attack source agentdojo: {path}: vector {name!r}: {e}") from e
            out.append(BenignText(id=f"agentdojo/{suite}/{name}", source=self.family, text=str(text),
                                  category="injection_vector_default",
                                  origin=f"agentdojo/data/suites/{suite}/injection_vectors.yaml {name}"))
        return tuple(out)

    def templates(self) -> tuple[Template, ...]:
        return self._texts[0]

    def goals(self) -> tuple[Goal, ...]:
        return self._texts[1]

    def benign(self) -> tuple[BenignText, ...]:
        return self._texts[2]

    def provenance(self) -> tuple[Provenance, ...]:
        _, version = self._root
        self._texts  # noqa: B018 - checks the installed release (sets self.accepted)
        return (Provenance(
            source=self.family, origin=f"agentdojo=={version} (PyPI; github.com/ethz-spylab/agentdojo)",
            version=version,
            paths=("agentdojo/attacks/baseline_attacks.py", "agentdojo/attacks/important_instructions_attacks.py",
                   "agentdojo/default_suites/v*/*/injection_tasks.py",
                   "agentdojo/data/suites/*/injection_vectors.yaml"),
            license="MIT",
            notice="Copyright (c) 2024 Edoardo Debenedetti, Jie Zhang, Mislav Balunovic, "
                   "Luca Beurer-Kellner, Marc Fischer, and Florian Tramèr",
            note=f"read from the installed package, never imported; benchmark {self.benchmark_version}"
                 + (f"; {self.accepted}" if self.accepted else "")),)
