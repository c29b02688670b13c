# kvlab's layers (docs/design.md, "Layers"), bottom to top, and what each may include: the layers
# it lists here and, transitively, theirs. engine and press are siblings (neither sees the other);
# session brings them together. CMakeLists.txt links each layer's library to the layers listed,
# and check_layers.cmake fails the build when a file includes a header of a layer it may not see.
set(KVLAB_LAYERS core kernels text model cache press engine session eval server app tools)
set(KVLAB_LAYER_DEPS_core)
set(KVLAB_LAYER_DEPS_kernels core)
set(KVLAB_LAYER_DEPS_text core)
set(KVLAB_LAYER_DEPS_model kernels text)
set(KVLAB_LAYER_DEPS_cache model)
set(KVLAB_LAYER_DEPS_press cache)
set(KVLAB_LAYER_DEPS_engine cache)
set(KVLAB_LAYER_DEPS_session engine press)
set(KVLAB_LAYER_DEPS_eval session)
set(KVLAB_LAYER_DEPS_server session)
# app: the front ends' floor (loading by name with the fetcher, the environment's stores, options
# from strings, compressing a cache in place); tools/ (the CLI) and python/ (the module) sit on it.
set(KVLAB_LAYER_DEPS_app eval server)
set(KVLAB_LAYER_DEPS_tools app)
# python/src/ (the module `import kvlab`): checked as a layer, built as its own target.
set(KVLAB_FRONT_LAYERS python)
set(KVLAB_LAYER_DEPS_python app)
# The public headers (include/kvlab/) of each layer.
set(KVLAB_PUBLIC_core error.h log.h sys.h cpu_share.h)
set(KVLAB_PUBLIC_kernels kernels.h)
set(KVLAB_PUBLIC_text text.h)
set(KVLAB_PUBLIC_model model.h registry.h provenance.h)
set(KVLAB_PUBLIC_cache cache.h cache_file.h observer.h)
set(KVLAB_PUBLIC_press press.h surrogate.h callback_press.h)
set(KVLAB_PUBLIC_engine engine.h op_profile.h batch_decoder.h)
set(KVLAB_PUBLIC_session session.h compress_flow.h decode_policy.h scorer_training.h)
