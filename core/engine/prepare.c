/* SPDX-License-Identifier: MIT */
#include "prepare.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* A buffer kept from an earlier cycle serves while it is large enough and
 * not much larger (host memory stays near the live bytes). */
bool prep_host_fits(const struct hostbuf *hb, size_t kept)
{
	size_t want = round_up(kept, 4096);

	return hb->ptr && hb->size >= want &&
	       hb->size - want <= MAX(hb->size / 4, HOSTBUF_SLACK_BYTES);
}

static bool host_buffer_fits(const struct chunk *c)
{
	return prep_host_fits(&c->host, c->plan.kept);
}

int prep_host_copy(struct engine *e, size_t kept, bool reclaimable, struct hostbuf *ret)
{
	struct hostbuf hb = { 0 };
	int r;

	r = hostbuf_alloc(e->backend, kept, &hb);
	if (r < 0)
		return r;
	if (reclaimable || e->pin_host)
		hostbuf_touch(e->workers, &hb);
	if (reclaimable) {
		r = hostbuf_make_reclaimable(e->backend, &hb);
		if (r > 0) /* dropped at once: no use */
			r = error_set(-EOPNOTSUPP, "%s", dormant_last_error());
	} else if (e->pin_host) {
		r = hostbuf_pin(e->backend, &hb, e->pin_piece, e->pin_threads);
	}
	if (r < 0) {
		hostbuf_free(e->backend, &hb);
		return r;
	}
	*ret = hb;
	return 0;
}

/* A buffer of the plan's size, pinned where the engine pins, and not one the
 * kernel may have taken pages of (host mode reclaimable). */
static bool needs_host_buffer(const struct engine *e, const struct chunk *c)
{
	return !host_buffer_fits(c) || c->host.reclaimable || (e->pin_host && !c->host.pin_piece);
}

/* Stage one: a buffer of the right size, faulted in. */
static int host_fault_in(struct engine *e, struct engine_item *it)
{
	struct chunk *c = it->chunk;
	double start = now_monotonic_s();
	int r;

	/* the last wake's unpin of it, on a worker, must be done */
	engine_host_settle(e, &c->host);
	if (c->host.reclaimable && host_buffer_fits(c)) {
		/* host mode reclaimable: only the pages the kernel took fault */
		engine_account_host(it->owner.held, (int64_t)c->host.size);
		hostbuf_reuse(e->workers, &c->host);
		engine_time_add(&e->host_prep_ns, start);
		return 0;
	}
	if (c->host.ptr) /* grown since its last sleep, or left unpinned */
		engine_host_free(e, it->owner.held, c);
	r = hostbuf_alloc(e->backend, c->plan.kept, &c->host);
	if (r < 0) {
		engine_time_add(&e->host_prep_ns, start);
		return r;
	}
	engine_account_host(it->owner.held, (int64_t)c->host.size);
	/* what is registered is faulted in first: far faster to register */
	if (it->pin)
		hostbuf_touch(e->workers, &c->host);
	engine_time_add(&e->host_prep_ns, start);
	return 0;
}

static void prep_fail(struct prep *p, int r)
{
	if (!p->error) {
		p->error = r;
		snprintf(p->message, sizeof(p->message), "%s", dormant_last_error());
	}
	pthread_cond_broadcast(&p->cond);
}

static void *prep_fault_main(void *arg)
{
	struct prep *p = arg;

	for (size_t k = 0; k < p->count; k++) {
		int r;

		pthread_mutex_lock(&p->lock);
		if (p->stop || p->error) {
			pthread_mutex_unlock(&p->lock);
			break;
		}
		pthread_mutex_unlock(&p->lock);
		r = host_fault_in(p->e, p->queue[k]);
		pthread_mutex_lock(&p->lock);
		if (r < 0)
			prep_fail(p, r);
		else
			p->faulted = k + 1;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		if (r < 0)
			break;
	}
	return NULL;
}

int prep_start(struct prep *p, struct engine *e, int d, struct engine_item *items,
		      size_t count)
{
	memset(p, 0, sizeof(*p));
	p->e = e;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->queue = malloc(MAX(count, (size_t)1) * sizeof(*p->queue));
	if (!p->queue)
		return error_set(-ENOMEM, "out of host memory");
	for (size_t i = 0; i < count; i++) {
		struct engine_item *it = &items[i];

		if (it->owner.device == d && engine_item_keep(it) && !engine_item_disk(it) &&
		    it->chunk->mapped &&
		    it->chunk->plan.kept && needs_host_buffer(e, it->chunk))
			p->queue[p->count++] = it;
	}
	if (!p->count)
		return 0;
	/* Without the thread, prep_wait() prepares each buffer itself. */
	if (pthread_create(&p->fault_thread, NULL, prep_fault_main, p) == 0)
		p->fault_running = true;
	return 0;
}

/* Wait until it has its host buffer (the consumer takes the queue in order). */
int prep_wait(struct prep *p, struct engine_item *it)
{
	size_t k = p->next;
	int r = 0;

	if (k == p->count || p->queue[k] != it)
		return 0; /* its buffer was there already */
	p->next++;
	if (!p->fault_running)
		return host_fault_in(p->e, it);
	pthread_mutex_lock(&p->lock);
	while (p->faulted <= k && !p->error)
		pthread_cond_wait(&p->cond, &p->lock);
	if (p->faulted <= k)
		r = error_set(p->error, "%s", p->message);
	pthread_mutex_unlock(&p->lock);
	return r;
}

void prep_finish(struct prep *p)
{
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	if (p->fault_running)
		pthread_join(p->fault_thread, NULL);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p->queue);
}
