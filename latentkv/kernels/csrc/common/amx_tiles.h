// AMX tile configuration shared by the kernels that use tiles (qlinear.cpp isa_amx,
// attention/mla_prefill_amx.h). Included inside a namespace compiled with amx-tile; nothing here may
// include a header. Callers run it in each thread before its first tile instruction.
#pragma once

struct AmxTileConfig {  // ldtilecfg's 64-byte operand, palette 1
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// ldtilecfg with every byte of cfg written first: GCC 12 takes the intrinsic's operand for a read of
// its first bytes only and dropped the stores of rows / colsb in a leaf function (the tiles then
// stayed unconfigured and the first tile instruction faulted)
static inline void amx_load_config(AmxTileConfig& cfg) {
  asm volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

static inline void amx_configure() {  // tiles 0-7: 16 rows of 64 bytes each
  AmxTileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  amx_load_config(cfg);
}
