# Installs the stock build's libllama (+ llama-batched-bench, llama-quantize) beside its ggml.
# Run with: cmake -DBIN=<stock build>/bin -DPREFIX=<dist>/stock -P install_stock.cmake
# (llama.cpp's own install step would also install tools/mtmd, which we do not build.)
file(GLOB libs "${BIN}/libllama*.so*")
file(COPY ${libs} DESTINATION "${PREFIX}/lib")
file(COPY "${BIN}/llama-batched-bench" "${BIN}/llama-quantize" DESTINATION "${PREFIX}/bin")
