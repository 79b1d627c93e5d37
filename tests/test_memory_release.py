"""A finished generation's KV cache is freed when its last reference goes (no reference cycle waits for the
cyclic collector), and the server's idle-time release of free heap memory runs."""

import gc
import weakref

from specdec.api.request import GenerationRequest
from specdec.engine.batched import run_alone
from specdec.server.memory import release_free_memory


def test_a_finished_generation_frees_its_kv_cache_without_the_cyclic_collector(tiny_generator):
    gc.collect()
    gc.disable()  # only reference counting may free it
    try:
        generation = tiny_generator.start(GenerationRequest("hello hello the world", 12), interleaved=True)
        chunks = list(run_alone(generation))
        assert chunks and generation.finished
        cache = weakref.ref(generation.cache)
        del generation
        assert cache() is None, "a reference cycle keeps the generation's KV cache alive"
    finally:
        gc.enable()


def test_free_heap_memory_can_be_returned_on_glibc():
    import platform
    assert release_free_memory() is (platform.libc_ver()[0] == "glibc")
