"""batchfold: dynamic batching for neural networks over trees, graphs and sequences.

The pipeline: a front end records per-instance ops into a :class:`Graph`; :func:`schedule`
groups them into a :class:`Plan` of batched steps; the executor runs the plan with one
PyTorch call per step. :func:`batch_map` does all three for single-instance PyTorch code.
"""

from . import blocks as blocks
from .errors import ArgumentShapeError as ArgumentShapeError
from .errors import BatchfoldError as BatchfoldError
from .errors import BatchingRuleError as BatchingRuleError
from .errors import BlockInputError as BlockInputError
from .errors import BlockTypeError as BlockTypeError
from .errors import CheckpointError as CheckpointError
from .errors import CommandLineError as CommandLineError
from .errors import ConfigError as ConfigError
from .errors import ConlluFormatError as ConlluFormatError
from .errors import DeviceError as DeviceError
from .errors import DtypeError as DtypeError
from .errors import GraphError as GraphError
from .errors import IndexShapeError as IndexShapeError
from .errors import LazyValueError as LazyValueError
from .errors import MoleculeFormatError as MoleculeFormatError
from .errors import ShapeError as ShapeError
from .errors import SSTFormatError as SSTFormatError
from .errors import UnsupportedOpError as UnsupportedOpError
from .execute import Executor as Executor
from .graph import Graph as Graph
from .graph import Signature as Signature
from .graph import TensorMeta as TensorMeta
from .lazy import Lazy as Lazy
from .lazy import batch_map as batch_map
from .lazy import function as function
from .lazy import last_stats as last_stats
from .lazy.semantics import no_cache as no_cache
from .ops import RULES as RULES
from .ops import OpRule as OpRule
from .schedule import Plan as Plan
from .schedule import Step as Step
from .schedule import schedule as schedule
from .stats import Stats as Stats

__version__ = "0.1.0"
