"""What a SavedModel's graph may run: checked in its saved_model.pb before anything loads it.

Loading a SavedModel (`tf.saved_model.load`) runs its graph: resource initializers at once,
a signature's function on every call. A graph is a program: besides maths it may read and
write files (`ReadFile`, `WriteFile`, `MatchingFiles`, a TFRecord writer), call back into
Python (`PyFunc`, `EagerPyFunc`) or talk to other machines. So `predict --saved_model` and
`generate --saved_model` first parse saved_model.pb as a protocol buffer (which runs nothing)
and walk every op in it: the nodes of each meta graph and every function of its library
(signature functions, the functions they call, the bodies of `While`, `If`,
`StatefulPartitionedCall`, ..., at any depth, and functions no signature reaches, which
loading may still run).

Each op must be in `allowed_ops.txt` beside this module: the ops bert-train's own exports use
(every family's, `tests/export/test_graph_check.py` keeps the list equal to what they hold).
Its `[variable restore]` section lists ops allowed only in the functions the graph's saver
names (`SaverDef`: writing and reading the variables checkpoint). `DENIED_OPS` is refused
wherever it appears, even if someone adds one of them to the list by mistake. A graph holding
any other op is refused in one line naming the op and the function, unless the user trusts
it (`--trust_saved_model`).
"""

import collections
import dataclasses
import functools
import os

from bert_trainer.errors import UserError

ALLOWED_OPS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed_ops.txt")
RESTORE_SECTION = "[variable restore]"
INIT_SIGNATURE = "__saved_model_init_op"  # tf.saved_model.load runs it (resource initializers)

# Ops that touch files, processes or the network: never allowed outside the saver's own
# functions (SaveV2, RestoreV2, MergeV2Checkpoints there), whatever allowed_ops.txt says.
DENIED_OPS = frozenset({
    # files
    "ReadFile", "WriteFile", "MatchingFiles", "ImmutableConst", "RecordInput",
    "Save", "SaveSlices", "SaveV2", "Restore", "RestoreSlice", "RestoreV2",
    "MergeV2Checkpoints", "LoadAndRemapMatrix", "GenerateVocabRemapping",
    "InitializeTableFromTextFile", "InitializeTableFromTextFileV2",
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset",
    "LMDBDataset", "ExperimentalLMDBDataset", "SqlDataset", "ExperimentalSqlDataset",
    "CacheDataset", "CacheDatasetV2", "SnapshotDataset", "SnapshotDatasetV2",
    "SnapshotDatasetReader", "SaveDataset", "SaveDatasetV2", "LoadDataset",
    "DatasetToTFRecord", "ExperimentalDatasetToTFRecord", "MatchingFilesDataset",
    "ExperimentalMatchingFilesDataset", "WholeFileReader", "WholeFileReaderV2",
    "TextLineReader", "TextLineReaderV2", "TFRecordReader", "TFRecordReaderV2",
    "FixedLengthRecordReader", "FixedLengthRecordReaderV2", "LMDBReader", "IdentityReader",
    "IdentityReaderV2", "ReaderRead", "ReaderReadV2", "ReaderReadUpTo", "ReaderReadUpToV2",
    "ReaderRestoreState", "ReaderRestoreStateV2", "ReaderSerializeState",
    "ReaderSerializeStateV2", "CreateSummaryFileWriter", "CreateSummaryDbWriter",
    "SummaryWriter", "WriteSummary", "WriteRawProtoSummary", "WriteScalarSummary",
    "WriteHistogramSummary", "WriteImageSummary", "WriteAudioSummary", "WriteGraphSummary",
    "ImportEvent", "FlushSummaryWriter", "CloseSummaryWriter", "DecodeProtoV2", "EncodeProto",
    "PrintV2", "Print", "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3",
    "DebugNanCount", "DebugNumericSummary", "DebugNumericSummaryV2",
    "FileSystemSetConfiguration",
    # Python, processes
    "PyFunc", "PyFuncStateless", "EagerPyFunc", "Abort",
    # the network
    "Send", "Recv", "_Send", "_Recv", "_HostSend", "_HostRecv", "RpcServer", "RpcClient",
    "RpcCall", "RpcServerStart", "RpcServerRegister", "RpcGetValue", "RpcCheckStatus",
    "DeleteRpcFutureResource", "Rpc", "TryRpc", "DataServiceDataset", "DataServiceDatasetV2",
    "DataServiceDatasetV3", "DataServiceDatasetV4", "RegisterDataset", "RegisterDatasetV2",
    "DistributedSave", "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
    "CollectiveGather", "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastRecv",
    "CollectiveBcastSendV2", "CollectiveBcastRecvV2", "CollectiveAllToAllV2",
    "CollectiveAllToAllV3", "CollectiveInitializeCommunicator", "NcclAllReduce",
})
# The variables checkpoint's own ops: allowed in the saver's functions, nowhere else.
SAVER_FILE_OPS = frozenset({"SaveV2", "RestoreV2", "MergeV2Checkpoints"})


@dataclasses.dataclass(frozen=True)
class AllowedOps:
    """Ops allowed anywhere (`serving`) and only in the saver's functions (`restore`)."""

    serving: frozenset
    restore: frozenset


@functools.cache
def allowed_ops(path: str = ALLOWED_OPS_FILE) -> AllowedOps:
    """The allow-list: one op a line, `#` comments, then the `[variable restore]` section."""
    sections = {"serving": set(), "restore": set()}
    current = "serving"
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line == RESTORE_SECTION:
                current = "restore"
            elif line:
                sections[current].add(line)
    return AllowedOps(frozenset(sections["serving"]), frozenset(sections["restore"]))


@dataclasses.dataclass(frozen=True)
class ForeignOp:
    """An op a graph holds that bert-train's exports never use.

    Attributes:
      op: the op's type, e.g. "WriteFile".
      function: the library function holding it ("" for a meta graph's own nodes).
      signature: a signature whose call reaches it (None: no signature reaches it).
      denied: whether it is in `DENIED_OPS` (files, processes, network).
    """

    op: str
    function: str
    signature: str | None
    denied: bool

    def where(self) -> str:
        place = f"function '{self.function}'" if self.function else "the graph's own nodes"
        if self.signature == INIT_SIGNATURE:
            reach = "which loading runs"
        elif self.signature:
            reach = f"reached from signature '{self.signature}'"
        else:
            reach = "which loading may run"
        return f"{place} ({reach})"


def _called(node, library) -> list[str]:
    """The library functions a node calls: its op (a function call) and function attrs."""
    names = [node.op] if node.op in library else []
    pending = list(node.attr.values())
    while pending:
        attr = pending.pop()
        funcs = [attr.func] if attr.HasField("func") else list(attr.list.func)
        for func in funcs:
            names.append(func.name)
            pending.extend(func.attr.values())  # a function's attrs may name functions too
    return [name for name in names if name in library]


def _reached(roots, library, functions=()) -> set[str]:
    """Every function `roots` (top-level nodes) and `functions` call, at any depth, and
    `functions` themselves."""
    seen = set()
    pending = [name for node in roots for name in _called(node, library)]
    pending += [name for name in functions if name in library]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(n for node in library[name].node_def
                           for n in _called(node, library))
    return seen


def _feeding(nodes: dict, tensor_names) -> list:
    """The top-level nodes the named tensors depend on (data and control inputs)."""
    seen, pending = set(), [t.split(":")[0].lstrip("^") for t in tensor_names]
    while pending:
        name = pending.pop()
        if name in nodes and name not in seen:
            seen.add(name)
            pending.extend(i.split(":")[0].lstrip("^") for i in nodes[name].input)
    return [nodes[name] for name in seen]


def _meta_graph_findings(meta_graph, allowed: AllowedOps, used: tuple) -> list[ForeignOp]:
    graph = meta_graph.graph_def
    library = {f.signature.name: f for f in graph.library.function}
    nodes = {node.name: node for node in graph.node}
    reached_from = {}  # function -> the first signature reaching it (the used ones first)
    for key in sorted(meta_graph.signature_def, key=lambda k: (k not in used, k)):
        outputs = [t.name for t in meta_graph.signature_def[key].outputs.values()]
        for name in _reached(_feeding(nodes, outputs), library):
            reached_from.setdefault(name, key)
    # The saver's functions (TF1 loaders run them; tf.saved_model.load restores variables
    # itself) may hold the checkpoint ops, unless anything else reaches them too: another
    # node, a signature, or a function of the object graph (which loading may call).
    saver = meta_graph.saver_def
    saver_nodes = _feeding(nodes, [saver.save_tensor_name, saver.restore_op_name])
    others = [node for node in graph.node if node.name not in {n.name for n in saver_nodes}]
    exposed = _reached(others, library, meta_graph.object_graph_def.concrete_functions)
    saver_only = _reached(saver_nodes, library) - exposed - set(reached_from)
    found = []

    def check(node, function: str, signature) -> None:
        if node.op in library:
            return  # a call: the function is checked on its own
        extra = allowed.restore if function in saver_only else frozenset()
        denied = node.op in DENIED_OPS and not (function in saver_only
                                                and node.op in SAVER_FILE_OPS)
        if denied or node.op not in allowed.serving | extra:
            found.append(ForeignOp(node.op, function, signature, denied))

    for node in graph.node:
        check(node, "", None)
    for name in sorted(library, key=lambda n: (n not in reached_from, n)):
        for node in library[name].node_def:
            check(node, name, reached_from.get(name))
    return found


def foreign_ops(saved_model_pb: bytes, signatures=(), allowed: AllowedOps | None = None
                ) -> list[ForeignOp]:
    """The ops of a serialized SavedModel outside the allow-list (or denied), in order:
    those reached from `signatures` first, then from other signatures, then the rest.

    Raises:
      google.protobuf.message.DecodeError: the bytes are not a SavedModel.
    """
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415 (parses, runs nothing)

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(saved_model_pb)
    allowed = allowed or allowed_ops()
    found = [f for meta_graph in proto.meta_graphs
             for f in _meta_graph_findings(meta_graph, allowed, tuple(signatures))]
    rank = collections.defaultdict(lambda: 1, {s: 0 for s in signatures})
    return sorted(found, key=lambda f: (not f.denied, f.signature is None,
                                        rank[f.signature]))


def check_saved_model(saved_model: str, signatures=(), *, trust: bool = False) -> None:
    """Refuses a SavedModel whose graph holds an op bert-train's exports never use.

    Reads `saved_model`/saved_model.pb only: nothing of the graph runs.

    Args:
      saved_model: the directory given as --saved_model.
      signatures: the signatures the command calls (named first in the message).
      trust: --trust_saved_model: skip the check.

    Raises:
      UserError: an unreadable saved_model.pb, or a foreign op (the first, named with its
        function).
    """
    if trust:
        return
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    path = os.path.join(saved_model, "saved_model.pb")
    try:
        with open(path, "rb") as f:
            data = f.read()
        found = foreign_ops(data, signatures)
    except (OSError, DecodeError, RuntimeError) as e:
        raise UserError(f"--saved_model={saved_model}: {path} cannot be read as a SavedModel "
                        f"({str(e).strip().splitlines()[0] if str(e).strip() else e!r}); "
                        "re-export it with 'bert-train export'") from None
    if found:
        first = found[0]
        kind = ("which reads or writes files, runs Python or uses the network" if first.denied
                else "which bert-train's exports never use")
        others = len({f.op for f in found} - {first.op})
        more = f", and {others} more ops outside bert-train's list" if others else ""
        raise UserError(f"--saved_model={saved_model} was not loaded: its graph runs op "
                        f"'{first.op}', {kind}, in {first.where()}{more}; load a SavedModel "
                        "that 'bert-train export' wrote, or pass --trust_saved_model if you "
                        "trust where this one came from")
