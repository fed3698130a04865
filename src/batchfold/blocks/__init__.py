"""Blocks: TensorFlow Fold's typed combinators, compiled onto batchfold's graph and executor.

Compose blocks (``Map(Scalar("int64") >> Embedding(100, 16)) >> RNN(cell)``), compile the
root with :func:`compile`, and call the model on a list of Python inputs: every input is
walked once, its operations become graph nodes, and the batch runs as a few batched steps.
Types are checked when blocks are composed; see :mod:`batchfold.blocks.types`.
"""

from .base import Block as Block
from .base import Identity as Identity
from .combinators import AllOf as AllOf
from .combinators import Metric as Metric
from .combinators import Pipe as Pipe
from .combinators import Record as Record
from .combinators import Void as Void
from .compiler import CompiledModel as CompiledModel
from .compiler import compile as compile
from .conditionals import OneOf as OneOf
from .conditionals import Optional as Optional
from .constants import FromTensor as FromTensor
from .constants import Zeros as Zeros
from .convert import convert_to_block as convert_to_block
from .function import Function as Function
from .layers import FC as FC
from .layers import Embedding as Embedding
from .plan import BlockPlan as BlockPlan
from .plan import SequenceBatch as SequenceBatch
from .pyobjects import GetItem as GetItem
from .pyobjects import InputTransform as InputTransform
from .pyobjects import Slice as Slice
from .recursion import ForwardDeclaration as ForwardDeclaration
from .sequences import RNN as RNN
from .sequences import Broadcast as Broadcast
from .sequences import Fold as Fold
from .sequences import Length as Length
from .sequences import Map as Map
from .sequences import Max as Max
from .sequences import Mean as Mean
from .sequences import Min as Min
from .sequences import NGrams as NGrams
from .sequences import Nth as Nth
from .sequences import Pad as Pad
from .sequences import Reduce as Reduce
from .sequences import Sum as Sum
from .sequences import Zip as Zip
from .sequences import ZipWith as ZipWith
from .tensors import Concat as Concat
from .tensors import OneHot as OneHot
from .tensors import OneHotFromList as OneHotFromList
from .tensors import Scalar as Scalar
from .tensors import Tensor as Tensor
from .tensors import Vector as Vector
from .types import BlockInputError as BlockInputError
from .types import BlockTypeError as BlockTypeError
from .types import BroadcastSequenceType as BroadcastSequenceType
from .types import PyObjectType as PyObjectType
from .types import SequenceType as SequenceType
from .types import TensorType as TensorType
from .types import TupleType as TupleType
from .types import Type as Type
from .types import VoidType as VoidType
from .wiring import Composition as Composition
