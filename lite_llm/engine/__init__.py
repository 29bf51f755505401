"""The engine: requests, KV block bookkeeping, continuous-batching scheduler, step loop.

Import the pieces from their modules; this package re-exports the ones callers use.
"""
from lite_llm.engine.async_engine import (AsyncEngine, EngineDeadError, EngineShutdownError,
                                          QueueFullError, RequestStream)
from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.request import Request, RequestStatus, SampleResult
from lite_llm.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from lite_llm.engine.stats import EngineStats

__all__ = ["AsyncEngine", "EngineConfig", "EngineDeadError", "EngineShutdownError", "EngineStats",
           "LLMEngine", "QueueFullError", "Request", "RequestStatus", "RequestStream",
           "SampleResult", "ScheduledChunk", "Scheduler", "SchedulerOutput"]
