"""A forward's inputs as rank 0 sends them to the workers: a small header
through each worker's pipe (an op, then which values follow, their dtypes and
shapes; no pickle) and one broadcast int64 tensor holding every tensor.
The values are the input ids, the positions, the Context's fields, then the
code of its CPU plan's class (0: none) and that plan's fields."""
from array import array
from dataclasses import fields

import torch

from tracengine.model.context import Context
from tracengine.runner.tp_comm import Communicator
from tracengine.runner.torch_plans import KVCopyPlan, PrefillGroups

OP_EXIT, OP_STEP = 0, 1
KIND_NONE, KIND_INT, KIND_TENSOR = 0, 1, 2
DTYPE_CODES = {torch.int64: 0, torch.int32: 1, torch.bool: 2}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
MAX_NDIM = 2
# Context fields sent to workers, in order; attention derives attn_metadata itself.
STEP_FIELDS = [f.name for f in fields(Context) if f.name not in ("attn_metadata", "cpu_plan")]
PLANS = (None, PrefillGroups, KVCopyPlan)   # a Context.cpu_plan's class, by its code
PLAN_CODES = {plan: code for code, plan in enumerate(PLANS)}
PLAN_FIELDS = {plan: [f.name for f in fields(plan)] for plan in PLANS[1:]}
EXIT_HEADER = array("q", [OP_EXIT]).tobytes()


def is_exit(header: bytes) -> bool:
    return array("q", header[:8])[0] == OP_EXIT


def encode_step(input_ids: torch.Tensor, positions: torch.Tensor, context: Context) -> tuple[bytes, torch.Tensor]:
    header = array("q", [OP_STEP])
    tensors = []
    plan = context.cpu_plan
    values = [input_ids, positions] + [getattr(context, name) for name in STEP_FIELDS]
    values.append(PLAN_CODES[type(plan) if plan is not None else None])
    if plan is not None:
        values.extend(getattr(plan, name) for name in PLAN_FIELDS[type(plan)])
    for value in values:
        if value is None:
            header.extend((KIND_NONE, 0, 0, 0, 0))
        elif isinstance(value, torch.Tensor):
            assert value.dtype in DTYPE_CODES and value.dim() <= MAX_NDIM, \
                f"cannot send {value.dtype}{tuple(value.shape)}"
            shape = list(value.shape) + [1] * (MAX_NDIM - value.dim())
            header.extend((KIND_TENSOR, DTYPE_CODES[value.dtype], value.dim(), *shape))
            tensors.append(value.reshape(-1).to(torch.int64))
        else:
            assert isinstance(value, int), f"cannot send a context field of type {type(value).__name__}"
            header.extend((KIND_INT, int(value), 0, 0, 0))
    return header.tobytes(), torch.cat(tensors)


def decode_step(header: bytes, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor, Context]:
    """Receive the broadcast that follows `header` and rebuild the forward's inputs."""
    items = array("q", header)[1:]
    specs = [tuple(items[i:i + 5]) for i in range(0, len(items), 5)]
    numels = [d0 * d1 for kind, _, _, d0, d1 in specs if kind == KIND_TENSOR]
    payload = torch.empty(sum(numels), dtype=torch.int64, device=comm.device)
    comm.broadcast(payload)
    chunks = iter(payload.split(numels))
    values = []
    for kind, a, ndim, d0, d1 in specs:
        if kind == KIND_TENSOR:
            values.append(next(chunks).to(CODE_DTYPES[a]).view((d0, d1)[:ndim]))
        else:
            values.append(a if kind == KIND_INT else None)
    num_fields = 2 + len(STEP_FIELDS)
    context = Context(**dict(zip(STEP_FIELDS, values[2:num_fields])))
    context.is_prefill = bool(context.is_prefill)
    plan = PLANS[values[num_fields]]
    if plan is not None:
        context.cpu_plan = plan(*values[num_fields + 1:])
        if plan is KVCopyPlan:
            context.cpu_plan.reuse = bool(context.cpu_plan.reuse)
    return values[0], values[1], context
