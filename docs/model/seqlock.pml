/*
 * pgidgen next_id(): the seqlock over two sequences (docs/next_id.md), for spin.
 *
 * C is the counter (moved only by nextval: an atomic increment), B the offset (moved only under the shard's
 * generator lock). A reader draws values like next_id() does: read B, nextval(C), read B again, hand out
 * C + B only when both reads agree (else draw again). A raiser is next_id()'s slow path raising B towards the
 * clock (the clock is free here: a gap of 0, 1 or 3); the advancer is pgidgen.advance_generator(). Checked in
 * every interleaving: no value is handed out twice, and each reader's values increase.
 *
 *   spin -a seqlock.pml && gcc -DSAFETY -o pan pan.c && ./pan      errors: 0
 *   spin -DNO_SECOND_READ -a seqlock.pml ...                         errors: 1 (a duplicate: the check is needed)
 *   spin -DNO_LOCK -a seqlock.pml ...                                errors: 1 (raises must not overlap)
 */
#define DRAWS 2

byte C = 0;
byte B = 0;
bool locked = false;
int handed = 0;    /* bit v set: value v was handed out (values stay below 31 here) */

inline nextval(c) { d_step { C++; c = C } }
#ifdef NO_LOCK
inline acquire() { skip }
inline release() { skip }
#else
inline acquire() { atomic { !locked -> locked = true } }
inline release() { locked = false }
#endif

proctype reader() {
    byte b1, b2, c, v, last = 0, n = 0;
    do
    :: n < DRAWS ->
        b1 = B;
        nextval(c);
#ifdef NO_SECOND_READ
        b2 = b1;
#else
        b2 = B;
#endif
        if
        :: b1 == b2 ->
            v = c + b1;
            d_step { assert(v < 31 && (handed & (1 << v)) == 0); handed = handed | (1 << v) };
            assert(v > last);
            last = v;
            n++
        :: else -> skip    /* the offset moved around the nextval: discard v, draw again */
        fi
    :: else -> break
    od
}

proctype raiser() {
    byte b, c, gap;
    acquire();
    b = B;
    nextval(c);
    if
    :: gap = 0
    :: gap = 1
    :: gap = 3
    fi;
    B = b + gap;
    release()
}

proctype advancer() {
    byte b, c;
    acquire();
    b = B;
    nextval(c);
    if
    :: 9 > c + b -> B = b + (9 - (c + b))
    :: else -> skip
    fi;
    release()
}

init {
    atomic {
        run reader();
        run reader();
        run raiser();
        run advancer()
    }
}
