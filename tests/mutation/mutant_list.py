"""The bugs `make mutants` plants (tests/mutation/mutants.py), gathered from the lists of each pass
by area (tests/mutation/mutants_*.py): each one exact piece of a source file, replaced by a
plausible mistake, and the tests that must fail on it. Each was planted by hand; the ones
no test caught then have tests of their own now."""

from __future__ import annotations

from mutant_spec import Mutant
from mutants_checks_fit import CHECKS_FIT_MUTANTS
from mutants_cli import CLI_MUTANTS
from mutants_config import ENGINE_CONFIG_MUTANTS
from mutants_config_autoscale import CONFIG_AUTOSCALE_MUTANTS
from mutants_cpu_weights import CPU_WEIGHTS_MUTANTS
from mutants_edge_limits import EDGE_LIMITS_MUTANTS
from mutants_engine import ENGINE_MUTANTS
from mutants_engine_core import ENGINE_CORE_MUTANTS
from mutants_engine_parts import ENGINE_PARTS_MUTANTS
from mutants_execution import EXECUTION_MUTANTS
from mutants_first_pass import FIRST_PASS_MUTANTS
from mutants_fleet import FLEET_MUTANTS
from mutants_fleet_checklist import FLEET_CHECKLIST_MUTANTS
from mutants_fleet_control import FLEET_CONTROL_MUTANTS
from mutants_fleet_ops import FLEET_OPS_MUTANTS
from mutants_fleet_relay import FLEET_RELAY_MUTANTS
from mutants_fleet_scaling import FLEET_SCALING_MUTANTS
from mutants_generation import GENERATION_MUTANTS
from mutants_kernels import KERNELS_MUTANTS
from mutants_loadtest import LOADTEST_MUTANTS
from mutants_loadtest_parts import LOADTEST_PARTS_MUTANTS
from mutants_models import MODELS_MUTANTS
from mutants_numbers import NUMBERS_MUTANTS
from mutants_observability import OBSERVABILITY_MUTANTS
from mutants_observe_parts import OBSERVE_PARTS_MUTANTS
from mutants_reports import REPORTS_MUTANTS
from mutants_routes import ROUTES_MUTANTS
from mutants_scheduling_routing import SCHEDULING_ROUTING_MUTANTS
from mutants_server_edge import SERVER_EDGE_MUTANTS
from mutants_serving import SERVING_MUTANTS
from mutants_tools import TOOLS_MUTANTS
from mutants_trace import TRACE_MUTANTS
from mutants_trace_sources import TRACE_SOURCES_MUTANTS
from mutants_trace_views import TRACE_VIEWS_MUTANTS
from mutants_triton import TRITON_MUTANTS
from mutants_trust_config import TRUST_CONFIG_MUTANTS
from mutants_trust_edges import TRUST_EDGES_MUTANTS

__all__ = ["MUTANTS", "Mutant"]

MUTANTS = [*FIRST_PASS_MUTANTS, *ENGINE_MUTANTS, *FLEET_MUTANTS, *TOOLS_MUTANTS, *EXECUTION_MUTANTS,
           *SERVING_MUTANTS, *OBSERVABILITY_MUTANTS, *TRACE_MUTANTS, *LOADTEST_MUTANTS,
           *KERNELS_MUTANTS, *ENGINE_CONFIG_MUTANTS, *MODELS_MUTANTS, *SERVER_EDGE_MUTANTS,
           *ENGINE_CORE_MUTANTS, *CLI_MUTANTS, *TRACE_VIEWS_MUTANTS, *FLEET_CONTROL_MUTANTS,
           *EDGE_LIMITS_MUTANTS, *TRACE_SOURCES_MUTANTS, *LOADTEST_PARTS_MUTANTS,
           *FLEET_CHECKLIST_MUTANTS, *CPU_WEIGHTS_MUTANTS,
           *SCHEDULING_ROUTING_MUTANTS, *TRUST_CONFIG_MUTANTS,
           *CONFIG_AUTOSCALE_MUTANTS, *ROUTES_MUTANTS,
           *FLEET_RELAY_MUTANTS, *NUMBERS_MUTANTS, *GENERATION_MUTANTS,
           *FLEET_OPS_MUTANTS, *CHECKS_FIT_MUTANTS,
           *TRITON_MUTANTS, *FLEET_SCALING_MUTANTS, *REPORTS_MUTANTS,
           *TRUST_EDGES_MUTANTS, *ENGINE_PARTS_MUTANTS, *OBSERVE_PARTS_MUTANTS]
