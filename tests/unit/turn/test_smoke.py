from turn_fakes import Chat, ChatUpstream, make_service


async def test_smoke():
    upstream = ChatUpstream()
    service = make_service(upstream)
    chat = Chat(service)
    for i in range(3):
        out = await chat.send(chat.user_text(i))
        assert out["choices"][0]["message"]["content"].startswith("answer")
    await service.close()
    repo = service.store.repo
    assert repo.user_texts(chat.conversation_id) == [chat.user_text(i) for i in range(3)]
