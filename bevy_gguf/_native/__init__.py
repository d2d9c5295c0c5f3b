"""Native code behind the engine: loading libllama and libbevy, their bindings, the owners of their handles."""
