# Installs the stock build's libllama (+ llama-batched-bench, llama-quantize, and llama-server with
# its libraries where it was built) beside its ggml.
# Run with: cmake -DBIN=<stock build>/bin -DPREFIX=<dist>/stock -P install_stock.cmake
# (llama.cpp's own install step would also install headers and tools we do not use.)
file(GLOB libs "${BIN}/libllama*.so*" "${BIN}/libmtmd.so*")
file(COPY ${libs} DESTINATION "${PREFIX}/lib")
file(COPY "${BIN}/llama-batched-bench" "${BIN}/llama-quantize" DESTINATION "${PREFIX}/bin")
if(EXISTS "${BIN}/llama-server")
    file(COPY "${BIN}/llama-server" DESTINATION "${PREFIX}/bin")
endif()
