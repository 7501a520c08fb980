/*
 * sim/isa.h - the simulator's public API, for the simulator's own files.
 *
 * The declarations live in include/ntensor/sim.h (public; ntensor.h
 * includes it); this file only keeps the old include working inside the tree.
 */
#ifndef NT_SIM_ISA_H
#define NT_SIM_ISA_H

#include "ntensor/sim.h"

#endif /* NT_SIM_ISA_H */
